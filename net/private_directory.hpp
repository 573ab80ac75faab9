#pragma once
// A directory only this user can enter (mkdtemp: mode 0700), for the Unix socket a server listens
// on behind a relay_listener: no other local user can reach the server except through the relay's
// bounds. Removed with everything in it when the object goes (not when the process is killed
// with -9: it sits under the temporary directory).

#include <string>
#include <string_view>

namespace troupe {

class private_directory {
 public:
  // Made in the temporary directory (or /tmp when its path leaves too little room for a Unix
  // socket's 107 bytes) as PREFIX-XXXXXX. Throws std::runtime_error naming the place and errno.
  explicit private_directory(std::string_view prefix);
  ~private_directory();
  private_directory(const private_directory&) = delete;
  private_directory& operator=(const private_directory&) = delete;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace troupe
