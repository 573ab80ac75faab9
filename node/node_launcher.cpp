#include "node/node_launcher.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <stdexcept>
#include <thread>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "doors/operator_log.hpp"

namespace troupe {

namespace {

constexpr size_t num_tail_lines = 20;  // quoted when a child fails to come up
constexpr auto poll_interval = std::chrono::milliseconds(100);

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exit code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return "signal " + std::to_string(WTERMSIG(status)) + " (" + ::strsignal(WTERMSIG(status)) + ")";
  }
  return "status " + std::to_string(status);
}

// True once `pid` has exited; the zombie stays for the caller to reap (WNOWAIT), so its pid
// cannot be reused while the launcher may still signal it.
bool has_exited(pid_t pid) {
  siginfo_t info{};
  return ::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == pid;
}

void write_all(int fd, const char* data, size_t size) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    data += n;
    size -= static_cast<size_t>(n);
  }
}

}  // namespace

struct node_launcher::child {
  child_spec spec;
  pid_t pid = -1;
  int output = -1;  // read end of the child's stdout and stderr
  bool ready = false;
  bool exited = false;
  int status = 0;
  std::deque<std::string> tail;  // its last lines
  std::thread reader;

  std::string last_lines() const {
    std::string text;
    for (const std::string& line : tail) text += "\n  " + line;
    return text.empty() ? " (it printed nothing)" : text;
  }
};

std::string label_child_line(const std::string& name, const std::string& line, bool json) {
  if (!json) return name + " | " + line;
  nlohmann::json object = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!object.is_object()) object = {{"level", "info"}, {"msg", line}};
  object["node"] = name;
  return object.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

child_spec node_child_spec(const node_address& address, const std::filesystem::path& credentials,
                           const std::filesystem::path& troupe_binary, const std::string& log_level) {
  child_spec spec;
  spec.name = address.name;
  spec.argv = {troupe_binary.string(),
               "node",
               "--listen",
               address.host + ":" + std::to_string(address.port),
               "--credentials",
               credentials.string(),
               "--name",
               address.name,
               "--log-level",
               log_level};
  spec.ready_text = "node " + address.name + " listening on";
  return spec;
}

child_spec controller_child_spec(const std::string& name, const std::filesystem::path& topology_file,
                                 const std::filesystem::path& troupe_binary,
                                 const std::vector<std::string>& serve_args) {
  child_spec spec;
  spec.name = name;
  spec.argv = {troupe_binary.string(), "serve", "--config", topology_file.string()};
  spec.argv.insert(spec.argv.end(), serve_args.begin(), serve_args.end());
  spec.ready_text = "serving: ZeroMQ on";
  return spec;
}

node_launcher::node_launcher(line_sink sink) : sink_(std::move(sink)) {}

node_launcher::~node_launcher() { stop(); }

pid_t node_launcher::start(const child_spec& spec) {
  if (spec.argv.empty()) throw std::invalid_argument("node_launcher: child '" + spec.name + "' has no program");
  // Held until the child and its reader are recorded: stop() waits for it, so it never begins
  // while a start (a supervisor's restart on another thread) is half done.
  std::lock_guard starting(start_mutex_);
  {
    std::lock_guard lock(mutex_);
    if (stopping_) return -1;
  }
  // Everything the child needs is made before fork: after it, only async-signal-safe calls.
  std::vector<std::string> args = spec.argv;
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  int output[2];
  int exec_failure[2];  // carries errno when exec fails; closed on a successful exec
  if (::pipe2(output, O_CLOEXEC) != 0)
    throw std::runtime_error("node_launcher: pipe: " + std::string(std::strerror(errno)));
  if (::pipe2(exec_failure, O_CLOEXEC) != 0) {
    const int e = errno;
    ::close(output[0]);
    ::close(output[1]);
    throw std::runtime_error("node_launcher: pipe: " + std::string(std::strerror(e)));
  }
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int e = errno;
    for (int fd : {output[0], output[1], exec_failure[0], exec_failure[1]}) ::close(fd);
    throw std::runtime_error("cannot start " + spec.name + ": fork: " + std::strerror(e));
  }
  if (pid == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    // The parent may have died before prctl: then no signal will come, so go now.
    if (::getppid() != parent) _exit(1);
    // The launcher blocks SIGINT and SIGTERM to sigwait for them; a blocked mask and ignored
    // signals survive exec, and would make the child deaf to stop().
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    for (int s : {SIGINT, SIGTERM, SIGHUP, SIGPIPE}) ::signal(s, SIG_DFL);
    const int null_input = ::open("/dev/null", O_RDONLY);
    if (null_input >= 0) ::dup2(null_input, STDIN_FILENO);
    ::dup2(output[1], STDOUT_FILENO);
    ::dup2(output[1], STDERR_FILENO);
    ::execv(argv[0], argv.data());
    const int e = errno;
    write_all(exec_failure[1], reinterpret_cast<const char*>(&e), sizeof e);
    _exit(127);
  }
  ::close(output[1]);
  ::close(exec_failure[1]);
  int exec_errno = 0;
  ssize_t n = 0;
  do {
    n = ::read(exec_failure[0], &exec_errno, sizeof exec_errno);
  } while (n < 0 && errno == EINTR);
  ::close(exec_failure[0]);
  if (n == static_cast<ssize_t>(sizeof exec_errno)) {
    ::close(output[0]);
    int status = 0;
    ::waitpid(pid, &status, 0);
    throw std::runtime_error("cannot start " + spec.name + ": cannot run " + spec.argv[0] + ": " +
                             std::strerror(exec_errno));
  }
  ::fcntl(output[0], F_SETFL, O_NONBLOCK);
  auto c = std::make_unique<child>();
  c->spec = spec;
  c->pid = pid;
  c->output = output[0];
  child& started = *c;
  {
    std::lock_guard lock(mutex_);
    children_.push_back(std::move(c));
    started.reader = std::thread([this, &started] { forward_output(started); });
  }
  spdlog::info("started {} (pid {}): {}", spec.name, pid, spec.argv[0]);
  return pid;
}

void node_launcher::emit(const std::string& line) {
  std::lock_guard lock(sink_mutex_);
  if (sink_) {
    sink_(line);
  } else {
    const std::string text = line + "\n";
    write_all(STDERR_FILENO, text.data(), text.size());
  }
}

// Reads the child's output until it ends, then reaps the child. The pipe may outlive the child
// (a grandchild that inherited it), so the child's exit ends the reading too.
void node_launcher::forward_output(child& c) {
  std::string pending;
  char buffer[4096];
  auto take_lines = [&](bool flush) {
    if (flush && !pending.empty() && pending.back() != '\n') pending += '\n';
    size_t start = 0;
    for (size_t end = pending.find('\n'); end != std::string::npos; end = pending.find('\n', start)) {
      std::string line = pending.substr(start, end - start);
      start = end + 1;
      emit(label_child_line(c.spec.name, line, current_log_format() == log_format::json));
      std::lock_guard lock(mutex_);
      if (!c.ready && line.find(c.spec.ready_text) != std::string::npos) {
        c.ready = true;
        changed_.notify_all();
      }
      c.tail.push_back(std::move(line));
      if (c.tail.size() > num_tail_lines) c.tail.pop_front();
    }
    pending.erase(0, start);
  };
  auto drain = [&] {  // what is in the pipe now; true at end of file
    for (int i = 0; i < 1024; ++i) {
      const ssize_t n = ::read(c.output, buffer, sizeof buffer);
      if (n > 0) {
        pending.append(buffer, static_cast<size_t>(n));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      return n == 0 || errno != EAGAIN;
    }
    return false;
  };
  for (;;) {
    pollfd p{c.output, POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(poll_interval.count()));
    if (ready < 0 && errno != EINTR) break;
    const bool end = drain();
    take_lines(false);
    if (end) break;
    if (ready == 0 && has_exited(c.pid)) {
      drain();
      break;
    }
  }
  take_lines(true);
  ::close(c.output);
  siginfo_t info{};
  while (::waitid(P_PID, static_cast<id_t>(c.pid), &info, WEXITED | WNOWAIT) != 0 && errno == EINTR) {
  }
  bool expected = false;
  {
    std::lock_guard lock(mutex_);
    ::waitpid(c.pid, &c.status, 0);
    c.exited = true;
    expected = stopping_;
    changed_.notify_all();
  }
  if (expected) {
    spdlog::info("{} (pid {}) stopped: {}", c.spec.name, c.pid, describe_status(c.status));
  } else {
    spdlog::warn("{} (pid {}) exited on its own: {}", c.spec.name, c.pid, describe_status(c.status));
  }
}

bool node_launcher::wait_until_ready(std::chrono::milliseconds timeout, const std::function<bool()>& cancelled) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const auto num_polls = timeout / poll_interval + 2;
  for (long i = 0; i <= num_polls; ++i) {
    {
      std::unique_lock lock(mutex_);
      bool all_ready = true;
      for (const auto& c : children_) {
        if (c->exited && !c->ready) {
          throw std::runtime_error(c->spec.name + " exited before it was up (" + describe_status(c->status) +
                                   "); its last lines:" + c->last_lines());
        }
        all_ready = all_ready && c->ready;
      }
      if (all_ready) return true;
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) {
        for (const auto& c : children_) {
          if (c->ready) continue;
          throw std::runtime_error(c->spec.name + " did not come up within " + std::to_string(timeout.count()) +
                                   " ms (no line with '" + c->spec.ready_text +
                                   "'); its last lines:" + c->last_lines());
        }
      }
      changed_.wait_until(lock, std::min(deadline, now + poll_interval));
    }
    if (cancelled && cancelled()) return false;
  }
  throw std::runtime_error("node_launcher: the children did not come up within " + std::to_string(timeout.count()) +
                           " ms");
}

void node_launcher::stop(std::chrono::milliseconds grace, const std::function<bool()>& hurry) {
  {
    std::lock_guard starting(start_mutex_);  // no start half done
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  std::unique_lock lock(mutex_);
  auto all_exited = [this] {
    for (const auto& c : children_) {
      if (!c->exited) return false;
    }
    return true;
  };
  // A child not yet marked exited is at most a zombie: signalling it cannot hit another process.
  for (const auto& c : children_) {
    if (!c->exited) ::kill(c->pid, SIGTERM);
  }
  const auto deadline = std::chrono::steady_clock::now() + grace;
  bool hurried = false;
  while (!all_exited() && std::chrono::steady_clock::now() < deadline) {
    changed_.wait_until(lock, std::min(deadline, std::chrono::steady_clock::now() + poll_interval));
    if (hurried || !hurry || all_exited()) continue;
    lock.unlock();
    hurried = hurry();
    lock.lock();
    for (const auto& c : children_) {
      if (hurried && !c->exited) ::kill(c->pid, SIGTERM);
    }
  }
  if (!all_exited()) {
    for (const auto& c : children_) {
      if (c->exited) continue;
      spdlog::warn("{} (pid {}) still runs {} ms after SIGTERM: killing it", c->spec.name, c->pid, grace.count());
      ::kill(c->pid, SIGKILL);
    }
    changed_.wait_for(lock, std::chrono::seconds(10), all_exited);
  }
  std::vector<std::thread*> readers;
  for (const auto& c : children_) {
    if (c->reader.joinable()) readers.push_back(&c->reader);
  }
  lock.unlock();
  for (std::thread* reader : readers) reader->join();
}

std::vector<child_state> node_launcher::children() const {
  std::lock_guard lock(mutex_);
  std::vector<child_state> states;
  for (const auto& c : children_) {
    const bool failed = c->exited && !(WIFEXITED(c->status) && WEXITSTATUS(c->status) == 0);
    states.push_back({c->spec.name, c->pid, c->ready, c->exited, c->exited ? describe_status(c->status) : "", failed});
  }
  return states;
}

bool node_launcher::stopping() const {
  std::lock_guard lock(mutex_);
  return stopping_;
}

}  // namespace troupe
