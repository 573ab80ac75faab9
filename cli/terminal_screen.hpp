#pragma once
// The terminal as `troupe inspect`'s live view uses it, like top: raw keys (no line editing, no
// echo), the alternate screen, a hidden cursor, and everything put back when the object ends,
// which the command makes sure happens on q, on Ctrl-C (SIGINT), SIGTERM and SIGHUP, and on an
// exception. Plain ANSI escapes and termios, nothing else.

#include <termios.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace troupe::cli {

class terminal_screen {
 public:
  // Throws std::runtime_error when stdout is not a terminal. Keys are read from stdin, which is
  // put in raw mode when it is a terminal too.
  terminal_screen();
  ~terminal_screen();  // restores the terminal's mode and screen
  terminal_screen(const terminal_screen&) = delete;
  terminal_screen& operator=(const terminal_screen&) = delete;

  // Redraws the whole screen with `lines` (each already cut to width()).
  void draw(const std::vector<std::string>& lines);
  size_t width() const;
  size_t height() const;

  // What the user pressed within `wait`: a key, "left"/"right" for the arrows, or nothing.
  // Returns early, with nothing, when a signal arrives.
  std::optional<std::string> read_key(std::chrono::milliseconds wait);

  // True once SIGINT, SIGTERM or SIGHUP arrived.
  static bool interrupted();
  // Installs the handlers that set interrupted(); call before any other thread starts, so that
  // they inherit the mask that leaves the signals to this thread.
  static void catch_signals();

 private:
  std::optional<termios> saved_;  // stdin's mode before, when it is a terminal
};

}  // namespace troupe::cli
