// The launcher's children are small shell scripts: each test says what its child prints and how
// it ends. Every launcher stops its children when it goes out of scope, also when an assertion
// fails.

#include "node/node_launcher.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace troupe {
namespace {

using namespace std::chrono_literals;

child_spec script(const std::string& name, const std::string& text, const std::string& ready = "ready") {
  return child_spec{name, {"/bin/sh", "-c", text}, ready};
}

// The children's lines, as the launcher forwards them.
struct captured_lines {
  std::mutex mutex;
  std::vector<std::string> lines;
  node_launcher::line_sink sink() {
    return [this](const std::string& line) {
      std::lock_guard lock(mutex);
      lines.push_back(line);
    };
  }
  bool has(const std::string& line) {
    std::lock_guard lock(mutex);
    for (const std::string& l : lines) {
      if (l == line) return true;
    }
    return false;
  }
};

// /proc/PID/stat: "PID (COMM) STATE PPID ..."; gone or a zombie counts as not running.
bool running(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t paren = text.rfind(')');
  return paren != std::string::npos && paren + 2 < text.size() && text[paren + 2] != 'Z';
}

pid_t parent_of(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t paren = text.rfind(')');
  if (paren == std::string::npos) return -1;
  std::istringstream rest(text.substr(paren + 2));
  char state = 0;
  pid_t parent = -1;
  rest >> state >> parent;
  return parent;
}

bool gone_within(pid_t pid, std::chrono::milliseconds bound) {
  const auto deadline = std::chrono::steady_clock::now() + bound;
  for (int i = 0; i < 1000 && std::chrono::steady_clock::now() < deadline; ++i) {
    if (!running(pid)) return true;
    std::this_thread::sleep_for(20ms);
  }
  return !running(pid);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(node_launcher, a_child_is_up_once_it_prints_its_ready_text_and_its_lines_come_prefixed_with_its_name) {
  captured_lines out;
  node_launcher launcher(out.sink());
  const pid_t pid = launcher.start(script("n1", "echo loading; echo 'node n1 ready on 4611' >&2; exec sleep 30"));
  ASSERT_TRUE(launcher.wait_until_ready(20s));
  EXPECT_TRUE(out.has("n1 | loading"));
  EXPECT_TRUE(out.has("n1 | node n1 ready on 4611"));  // stderr too
  EXPECT_EQ(parent_of(pid), ::getpid());
  launcher.stop();
  EXPECT_FALSE(running(pid));
  const auto children = launcher.children();
  ASSERT_EQ(children.size(), 1u);
  EXPECT_TRUE(children[0].exited);
  EXPECT_EQ(children[0].exit_status, "signal 15 (Terminated)");
}

TEST(node_launcher, a_child_that_exits_before_it_is_up_fails_the_wait_naming_it_with_its_last_lines) {
  captured_lines out;
  node_launcher launcher(out.sink());
  const pid_t other = launcher.start(script("n1", "echo ready; exec sleep 30"));
  launcher.start(script("n2", "echo 'cannot listen on 127.0.0.1:4612: address in use' >&2; exit 3"));
  const std::string error = error_of([&] { launcher.wait_until_ready(20s); });
  EXPECT_NE(error.find("n2 exited before it was up (exit code 3)"), std::string::npos) << error;
  EXPECT_NE(error.find("cannot listen on 127.0.0.1:4612: address in use"), std::string::npos) << error;
  launcher.stop();
  EXPECT_FALSE(running(other));
}

TEST(node_launcher, a_child_that_never_prints_its_ready_text_times_out_naming_it) {
  captured_lines out;
  node_launcher launcher(out.sink());
  launcher.start(script("n1", "echo loading the weights; exec sleep 30", "listening on"));
  const std::string error = error_of([&] { launcher.wait_until_ready(300ms); });
  EXPECT_NE(error.find("n1 did not come up within 300 ms (no line with 'listening on')"), std::string::npos) << error;
  EXPECT_NE(error.find("loading the weights"), std::string::npos) << error;
}

TEST(node_launcher, the_wait_ends_when_cancelled_and_leaves_the_children_running) {
  node_launcher launcher([](const std::string&) {});
  const pid_t pid = launcher.start(script("n1", "exec sleep 30"));
  int num_asked = 0;
  EXPECT_FALSE(launcher.wait_until_ready(20s, [&] { return ++num_asked == 2; }));
  EXPECT_TRUE(running(pid));
}

TEST(node_launcher, a_program_that_cannot_run_fails_start_naming_the_child_and_the_program) {
  node_launcher launcher;
  const std::string error = error_of([&] { launcher.start(child_spec{"n1", {"/nonexistent/troupe", "node"}, "x"}); });
  EXPECT_NE(error.find("cannot start n1: cannot run /nonexistent/troupe: No such file or directory"), std::string::npos)
      << error;
  EXPECT_TRUE(launcher.children().empty());
}

TEST(node_launcher, stop_sends_sigterm_first_and_a_child_may_end_cleanly) {
  captured_lines out;
  node_launcher launcher(out.sink());
  launcher.start(script("n1", "trap 'echo got TERM; exit 0' TERM; echo ready; while :; do sleep 0.1; done"));
  ASSERT_TRUE(launcher.wait_until_ready(20s));
  launcher.stop(20s);
  EXPECT_TRUE(out.has("n1 | got TERM"));
  EXPECT_EQ(launcher.children().at(0).exit_status, "exit code 0");
}

TEST(node_launcher, stop_kills_a_child_that_ignores_sigterm_once_the_grace_period_is_over) {
  node_launcher launcher([](const std::string&) {});
  // Its `sleep` keeps the output pipe open after the shell is killed: the launcher must not wait
  // for the pipe to close.
  const pid_t pid = launcher.start(script("n1", "trap '' TERM; echo ready; while :; do sleep 5; done"));
  ASSERT_TRUE(launcher.wait_until_ready(20s));
  launcher.stop(200ms);
  EXPECT_FALSE(running(pid));
  EXPECT_EQ(launcher.children().at(0).exit_status, "signal 9 (Killed)");
}

TEST(node_launcher, a_child_hears_sigterm_even_when_the_launcher_blocks_it) {
  // `troupe launch` blocks SIGTERM to sigwait for it; the children must not inherit that mask.
  sigset_t term, before;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &term, &before);
  {
    node_launcher launcher([](const std::string&) {});
    launcher.start(script("n1", "echo ready; exec sleep 30"));
    ASSERT_TRUE(launcher.wait_until_ready(20s));
    launcher.stop(20s);
    EXPECT_EQ(launcher.children().at(0).exit_status, "signal 15 (Terminated)");
  }
  pthread_sigmask(SIG_SETMASK, &before, nullptr);
}

TEST(node_launcher, a_child_that_exits_while_running_is_seen_exited_with_its_status) {
  node_launcher launcher([](const std::string&) {});
  launcher.start(script("n1", "echo ready; read line; exit 5"));  // stdin is /dev/null: read ends at once
  ASSERT_TRUE(launcher.wait_until_ready(20s));
  bool exited = false;
  for (int i = 0; i < 1000 && !exited; ++i) {
    exited = launcher.children().at(0).exited;
    if (!exited) std::this_thread::sleep_for(20ms);
  }
  ASSERT_TRUE(exited);
  EXPECT_EQ(launcher.children().at(0).exit_status, "exit code 5");
}

TEST(node_launcher, children_die_with_a_launcher_killed_without_cleanup) {
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  const pid_t launcher_process = ::fork();
  ASSERT_GE(launcher_process, 0);
  if (launcher_process == 0) {
    ::close(pipe_fds[0]);
    ::alarm(60);  // never outlives a test that failed to kill it
    node_launcher launcher([](const std::string&) {});
    const pid_t child = launcher.start(script("n1", "echo ready; exec sleep 60"));
    launcher.wait_until_ready(20s);
    ::write(pipe_fds[1], &child, sizeof child);
    for (;;) ::pause();
  }
  ::close(pipe_fds[1]);
  pid_t child = -1;
  const ssize_t n = ::read(pipe_fds[0], &child, sizeof child);
  ::close(pipe_fds[0]);
  ::kill(launcher_process, SIGKILL);
  int status = 0;
  ::waitpid(launcher_process, &status, 0);
  ASSERT_EQ(n, static_cast<ssize_t>(sizeof child));
  EXPECT_TRUE(gone_within(child, 20s)) << "the child " << child << " outlived its launcher";
  if (running(child)) ::kill(child, SIGKILL);
}

TEST(node_launcher, a_node_child_runs_troupe_node_with_its_address_credentials_and_name) {
  const child_spec spec =
      node_child_spec(node_address{"engine-a", "127.0.0.1", 4611}, "certs", "/usr/bin/troupe", "info");
  EXPECT_EQ(spec.name, "engine-a");
  EXPECT_EQ(spec.argv,
            (std::vector<std::string>{"/usr/bin/troupe", "node", "--listen", "127.0.0.1:4611", "--credentials", "certs",
                                      "--name", "engine-a", "--log-level", "info"}));
  EXPECT_EQ(spec.ready_text, "node engine-a listening on");
}

}  // namespace
}  // namespace troupe

namespace troupe {
namespace {

TEST(node_launcher, a_childs_line_is_labelled_with_its_node_and_stays_json_in_json_mode) {
  EXPECT_EQ(label_child_line("engine-a", "ready", false), "engine-a | ready");
  const auto own = nlohmann::json::parse(label_child_line("engine-a", R"({"level":"warn","msg":"slow"})", true));
  EXPECT_EQ(own["node"], "engine-a");
  EXPECT_EQ(own["level"], "warn");
  EXPECT_EQ(own["msg"], "slow");
  // A line that is not a JSON object (a crash message, a JSON scalar) is carried as one.
  for (const char* raw : {"terminate called after throwing", "42", "{\"cut"}) {
    const auto wrapped = nlohmann::json::parse(label_child_line("engine-a", raw, true));
    EXPECT_EQ(wrapped["msg"], raw);
    EXPECT_EQ(wrapped["node"], "engine-a");
  }
}

}  // namespace
}  // namespace troupe
