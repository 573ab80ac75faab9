#include "cli/terminal_screen.hpp"

#include <poll.h>
#include <pthread.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <csignal>
#include <stdexcept>

namespace troupe::cli {

namespace {

volatile std::sig_atomic_t received_signal = 0;

void on_signal(int signal) { received_signal = signal; }

void write_all(const std::string& text) {
  size_t done = 0;
  // Bounded: each write either makes progress or fails.
  for (int attempt = 0; attempt < 1000 && done < text.size(); ++attempt) {
    const ssize_t n = ::write(STDOUT_FILENO, text.data() + done, text.size() - done);
    if (n > 0) {
      done += static_cast<size_t>(n);
    } else if (n < 0 && errno != EINTR && errno != EAGAIN) {
      return;
    }
  }
}

}  // namespace

void terminal_screen::catch_signals() {
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = 0;  // no SA_RESTART: a signal ends the wait for a key at once
  for (int signal : {SIGINT, SIGTERM, SIGHUP}) ::sigaction(signal, &action, nullptr);
}

bool terminal_screen::interrupted() { return received_signal != 0; }

terminal_screen::terminal_screen() {
  if (!::isatty(STDOUT_FILENO)) {
    throw std::runtime_error("the live view needs a terminal on stdout; use --once (and --json for scripts)");
  }
  termios mode{};
  if (::isatty(STDIN_FILENO) && ::tcgetattr(STDIN_FILENO, &mode) == 0) {
    saved_ = mode;
    termios raw = mode;
    // Keys as they are pressed, unechoed; ISIG stays on so Ctrl-C is a SIGINT, which we catch.
    raw.c_lflag &= ~static_cast<tcflag_t>(ICANON | ECHO);
    raw.c_cc[VMIN] = 0;
    raw.c_cc[VTIME] = 0;
    ::tcsetattr(STDIN_FILENO, TCSANOW, &raw);
  }
  write_all("\x1b[?1049h\x1b[?25l\x1b[H\x1b[2J");  // alternate screen, cursor hidden, cleared
}

terminal_screen::~terminal_screen() {
  write_all("\x1b[?25h\x1b[?1049l");  // cursor shown, the screen as it was
  if (saved_) ::tcsetattr(STDIN_FILENO, TCSANOW, &*saved_);
}

size_t terminal_screen::width() const {
  winsize size{};
  if (::ioctl(STDOUT_FILENO, TIOCGWINSZ, &size) == 0 && size.ws_col > 0) return size.ws_col;
  return 80;
}

size_t terminal_screen::height() const {
  winsize size{};
  if (::ioctl(STDOUT_FILENO, TIOCGWINSZ, &size) == 0 && size.ws_row > 0) return size.ws_row;
  return 24;
}

void terminal_screen::draw(const std::vector<std::string>& lines) {
  std::string frame = "\x1b[H";
  for (size_t i = 0; i < lines.size(); ++i) {
    frame += lines[i];
    frame += "\x1b[K";  // the rest of the old line goes
    if (i + 1 < lines.size()) frame += "\r\n";
  }
  frame += "\x1b[J";  // and the old lines below
  write_all(frame);
}

std::optional<std::string> terminal_screen::read_key(std::chrono::milliseconds wait) {
  if (interrupted()) return std::nullopt;
  pollfd in{STDIN_FILENO, POLLIN, 0};
  if (::poll(&in, 1, static_cast<int>(wait.count())) <= 0 || !(in.revents & POLLIN)) {
    if (in.revents & (POLLHUP | POLLERR | POLLNVAL)) {
      // No keys will come (stdin closed): wait out the refresh rather than spin.
      ::poll(nullptr, 0, static_cast<int>(wait.count()));
    }
    return std::nullopt;
  }
  char keys[16];
  const ssize_t n = ::read(STDIN_FILENO, keys, sizeof keys);
  if (n <= 0) {
    ::poll(nullptr, 0, static_cast<int>(wait.count()));
    return std::nullopt;
  }
  const std::string pressed(keys, static_cast<size_t>(n));
  if (pressed == "\x1b[C" || pressed == "\x1bOC") return std::string("right");
  if (pressed == "\x1b[D" || pressed == "\x1bOD") return std::string("left");
  if (pressed[0] == '\x1b') return std::string();  // another escape sequence: ignored
  return pressed.substr(0, 1);
}

}  // namespace troupe::cli
