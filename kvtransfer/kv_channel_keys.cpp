// The KV channel's CURVE keys on disk, beside the members' TLS certificates.
//
//   NAME.kv.key   "public Z85\nsecret Z85\n", mode 0600: the member's key pair
//   NAME.kv.pub   "Z85\n": the member's public key, copied to every machine of the cluster

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <system_error>

#include "kvtransfer/kv_channel.hpp"

namespace troupe {

namespace {

constexpr size_t z85_key_chars = 40;
constexpr std::string_view key_file_suffix = ".kv.key";
constexpr std::string_view public_file_suffix = ".kv.pub";

[[noreturn]] void fail(const std::filesystem::path& file, const std::string& why) {
  throw std::runtime_error("kv channel keys: " + file.string() + ": " + why);
}

bool is_z85_key(const std::string& key) {
  std::array<uint8_t, 32> bytes{};
  return key.size() == z85_key_chars && zmq_z85_decode(bytes.data(), key.c_str()) != nullptr;
}

std::string read_file(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) fail(file, "cannot be read (missing? troupe certs --name writes it)");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// "public KEY" / "secret KEY" lines of a .kv.key file.
std::string field_of(const std::filesystem::path& file, const std::string& text, std::string_view field) {
  std::istringstream lines(text);
  for (std::string name, value; lines >> name >> value;) {
    if (name == field) {
      if (!is_z85_key(value)) fail(file, std::string(field) + " key is not 40 characters of Z85");
      return value;
    }
  }
  fail(file, "has no " + std::string(field) + " key");
}

void write_new(const std::filesystem::path& file, const std::string& text, mode_t mode) {
  std::filesystem::remove(file);
  // Created with its final mode (O_EXCL: not through a link someone left there), so a secret is
  // never readable by others, not even briefly.
  const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd < 0) fail(file, std::string("cannot be written: ") + std::strerror(errno));
  const bool written = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  const bool closed = ::close(fd) == 0;
  if (!written || !closed) fail(file, "cannot be written");
}

}  // namespace

kv_channel_keys load_kv_channel_keys(const std::filesystem::path& dir, std::string_view name) {
  const std::filesystem::path key_file = dir / (std::string(name) + std::string(key_file_suffix));
  const std::string text = read_file(key_file);
  kv_channel_keys keys;
  keys.public_key = field_of(key_file, text, "public");
  keys.secret_key = field_of(key_file, text, "secret");
  std::array<char, z85_key_chars + 1> derived{};
  if (zmq_curve_public(derived.data(), keys.secret_key.c_str()) != 0 || keys.public_key != derived.data()) {
    fail(key_file, "its public key does not belong to its secret key");
  }
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
    const std::string file_name = entry.path().filename().string();
    if (!file_name.ends_with(public_file_suffix)) continue;
    std::string key;
    std::istringstream(read_file(entry.path())) >> key;
    if (!is_z85_key(key)) fail(entry.path(), "is not a public key (40 characters of Z85)");
    keys.allowed_public_keys.push_back(key);
  }
  if (error) fail(dir, "cannot be listed: " + error.message());
  if (std::find(keys.allowed_public_keys.begin(), keys.allowed_public_keys.end(), keys.public_key) ==
      keys.allowed_public_keys.end()) {
    keys.allowed_public_keys.push_back(keys.public_key);
  }
  std::sort(keys.allowed_public_keys.begin(), keys.allowed_public_keys.end());
  return keys;
}

void write_kv_channel_keys(const std::filesystem::path& dir, std::string_view name, bool replace) {
  std::array<char, z85_key_chars + 1> public_key{}, secret_key{};
  if (zmq_curve_keypair(public_key.data(), secret_key.data()) != 0) {
    throw std::runtime_error(std::string("kv channel keys: no CURVE in this libzmq: ") + zmq_strerror(zmq_errno()));
  }
  std::filesystem::create_directories(dir);
  const std::filesystem::path key_file = dir / (std::string(name) + std::string(key_file_suffix));
  const std::filesystem::path public_file = dir / (std::string(name) + std::string(public_file_suffix));
  if (!replace) {
    for (const auto& file : {key_file, public_file}) {
      if (std::filesystem::exists(file)) fail(file, "exists (replace it with --replace)");
    }
  }
  write_new(key_file, "public " + std::string(public_key.data()) + "\nsecret " + std::string(secret_key.data()) + "\n",
            0600);
  write_new(public_file, std::string(public_key.data()) + "\n", 0644);
}

}  // namespace troupe
