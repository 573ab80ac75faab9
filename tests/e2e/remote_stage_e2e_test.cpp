// A stage spawned on another node: a real `troupe node` process on 127.0.0.1, credentials made by
// `troupe certs`, and a controller (this test's own actor system) that connects over mutual TLS,
// remote-spawns stages from their specs and talks to them with their replies coming back to
// actors of its own. A member of another CA is refused and the node keeps serving.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <optional>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <caf/openssl/all.hpp>

#include "stages/stage_actors.hpp"
#include "engine/model_runner.hpp"
#include "engine/served_model.hpp"
#include "node/cluster_credentials.hpp"
#include "node/remote_node.hpp"
#include "stages/error_category.hpp"
#include "stages/message_inspect.hpp"
#include "stages/message_types.hpp"
#include "tests/e2e/e2e_support.hpp"
#include "tests/scratch_dir.hpp"

namespace troupe::test {
namespace {

namespace fs = std::filesystem;

constexpr auto request_timeout = std::chrono::seconds(30);

using troupe::testing::scratch_dir;

// `troupe node --listen 127.0.0.1:0`, its log in `dir`; the port is read from the log. The child
// is stopped (SIGTERM, then SIGKILL) when this object ends, also when an assertion fails.
class node_process {
 public:
  node_process(const fs::path& credentials, const std::string& name, const fs::path& dir)
      : log_path_(dir / (name + ".log")) {
    process_.emplace(
        std::vector<std::string>{troupe_binary.string(), "node", "--listen", "127.0.0.1:0", "--credentials",
                                 credentials.string(), "--name", name, "--log-level", "info"},
        log_path_);
    static const std::regex listening(R"(node [A-Za-z0-9._-]+ listening on 127\.0\.0\.1:([0-9]+))");
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    for (int i = 0; i < 1500 && process_->alive() && std::chrono::steady_clock::now() < deadline; ++i) {
      const std::string text = log();
      std::smatch m;
      if (std::regex_search(text, m, listening)) {
        port_ = static_cast<uint16_t>(std::stoi(m[1]));
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    process_->stop();
    throw std::runtime_error("troupe node did not come up; its log:\n" + log());
  }
  uint16_t port() const { return port_; }
  bool alive() const { return process_->alive(); }
  // Whether the node has `file` memory-mapped (weights are mapped, never read into memory);
  // /proc names a mapping by its canonical path.
  bool maps(const fs::path& file) const {
    const std::string maps = read_file("/proc/" + std::to_string(process_->pid()) + "/maps");
    return alive() && !maps.empty() && maps.find(fs::canonical(file).string()) != std::string::npos;
  }
  std::string log() const { return read_file(log_path_); }

 private:
  fs::path log_path_;
  uint16_t port_ = 0;
  std::optional<child_process> process_;
};

struct controller_config : caf::actor_system_config {
  explicit controller_config(const member_credentials& files) {
    load<caf::io::middleman>();
    load<caf::openssl::manager>();
    set("logger.console", caf::atom("none"));
    set("openssl.certificate", files.certificate.string());
    set("openssl.key", files.private_key.string());
    set("openssl.cafile", files.ca_certificate.string());
    for_each_message_type(
        [this](auto type, const char* name) { add_message_type<typename decltype(type)::type>(name); });
    register_error_category(*this);
  }
};

struct node_answer {
  std::string name;
  std::vector<std::string> stages;
};

std::optional<node_answer> ping(caf::actor_system& system, const caf::actor& agent) {
  caf::scoped_actor self(system);
  std::optional<node_answer> answer;
  self->request(agent, request_timeout, ping_atom::value)
      .receive(
          [&](std::string& name, std::vector<std::string>& stages) {
            answer = node_answer{name, stages};
          },
          [&](caf::error& e) { ADD_FAILURE() << "ping: " << system.render(e); });
  return answer;
}

// Waits (bounded) for the node's log to hold `words`.
bool log_shows(const node_process& node, const std::string& words) {
  for (int i = 0; i < 250; ++i) {
    if (node.log().find(words) != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

class remote_stage_e2e : public ::testing::Test {
 protected:
  void SetUp() override {
    TROUPE_REQUIRE_SHARED_MODEL(stories_root);
    const fs::path credentials = dir_.path() / "credentials";
    const run_result made =
        run_troupe("certs --out " + shell_quote(credentials.string()) + " --name node1 --name controller");
    ASSERT_EQ(made.exit_code, 0) << made.err;
    controller_files_ = credentials_in(credentials, "controller");
    node_.emplace(credentials, "node1", dir_.path());
  }

  scratch_dir dir_;
  member_credentials controller_files_;
  std::optional<node_process> node_;
};

TEST_F(remote_stage_e2e, a_remotely_spawned_tokenizer_sends_its_schedule_request_to_the_controller) {
  controller_config config(controller_files_);
  caf::actor_system system(config);
  auto agent = caf::openssl::remote_actor(system, "127.0.0.1", node_->port());
  ASSERT_TRUE(agent) << system.render(agent.error()) << "\nnode log:\n" << node_->log();

  // An empty node: it runs nothing until a stage is placed on it.
  auto before = ping(system, *agent);
  ASSERT_TRUE(before);
  EXPECT_EQ(before->name, "node1");
  EXPECT_TRUE(before->stages.empty());

  caf::scoped_actor self(system);  // the scheduler and the doors, as far as the tokenizer knows
  auto tok = load_model_tokenizer(stories_dir);
  tokenizer_spec spec{stories_dir, 512, 512, caf::actor_cast<router_handle>(self),
                      caf::actor_cast<frontend_handle>(self)};
  auto tokenizer = system.middleman().remote_spawn<tokenizer_handle>((*agent)->node(), "tokenizer",
                                                                     caf::make_message(spec), request_timeout);
  ASSERT_TRUE(tokenizer) << system.render(tokenizer.error()) << "\nnode log:\n" << node_->log();

  tokenize_request request;
  request.request_id = 7;
  request.prompt = "Once upon a time, there was a little girl named Lily.";
  request.sampling.max_tokens = 5;
  self->send(*tokenizer, request);
  bool received = false;
  self->receive(
      [&](schedule_request& scheduled) {
        received = true;
        EXPECT_EQ(scheduled.request_id, 7);
        EXPECT_EQ(scheduled.prompt_ids, tok->encode(request.prompt));
        EXPECT_EQ(scheduled.sampling.max_tokens, 5);
      },
      [&](request_failed& failed) { ADD_FAILURE() << "refused: " << failed.message; },
      caf::after(request_timeout) >> [&] { ADD_FAILURE() << "no schedule_request within 30 s\n"
                                                         << node_->log(); });
  EXPECT_TRUE(received);

  // A prompt past the stage's limits comes back to the reply actor as a refusal, not a crash.
  tokenize_request too_large;
  too_large.request_id = 8;
  too_large.kind = prompt_kind::token_ids;
  too_large.prompt_token_ids = {1, 100000};
  self->send(*tokenizer, too_large);
  self->receive([&](request_failed& failed) { EXPECT_EQ(failed.request_id, 8); },
                [&](schedule_request&) { ADD_FAILURE() << "a token id past the vocabulary was scheduled"; },
                caf::after(request_timeout) >> [&] { ADD_FAILURE() << "no refusal within 30 s"; });

  auto after = ping(system, *agent);
  ASSERT_TRUE(after);
  EXPECT_EQ(after->stages, std::vector<std::string>{"tokenizer"});
  EXPECT_TRUE(log_shows(*node_, "stage tokenizer spawned")) << node_->log();
  // A tokenizer-only node maps no weights.
  EXPECT_FALSE(node_->maps(stories_root / "hf" / "model.safetensors"));
  caf::anon_send_exit(*tokenizer, caf::exit_reason::user_shutdown);
}

// A stage is asked for by its typed interface (stages/stage_interfaces.hpp): asked for as an
// untyped actor, or as a stage it is not, the node refuses the spawn.
TEST_F(remote_stage_e2e, a_stage_asked_for_with_another_interface_is_refused) {
  controller_config config(controller_files_);
  caf::actor_system system(config);
  auto agent = caf::openssl::remote_actor(system, "127.0.0.1", node_->port());
  ASSERT_TRUE(agent) << system.render(agent.error()) << "\nnode log:\n" << node_->log();
  caf::scoped_actor self(system);
  tokenizer_spec spec{stories_dir, 512, 512, caf::actor_cast<router_handle>(self),
                      caf::actor_cast<frontend_handle>(self)};
  auto untyped = system.middleman().remote_spawn<caf::actor>((*agent)->node(), "tokenizer", caf::make_message(spec),
                                                             request_timeout);
  ASSERT_FALSE(untyped) << "a tokenizer was handed out as an untyped actor";
  EXPECT_EQ(untyped.error(), caf::sec::unexpected_actor_messaging_interface) << system.render(untyped.error());
  auto other = system.middleman().remote_spawn<detokenizer_handle>((*agent)->node(), "tokenizer",
                                                                   caf::make_message(spec), request_timeout);
  ASSERT_FALSE(other) << "a tokenizer was handed out as a detokenizer";
  EXPECT_EQ(other.error(), caf::sec::unexpected_actor_messaging_interface) << system.render(other.error());
  // The node serves on: the tokenizer asked for as itself is spawned.
  auto tokenizer = system.middleman().remote_spawn<tokenizer_handle>((*agent)->node(), "tokenizer",
                                                                     caf::make_message(spec), request_timeout);
  ASSERT_TRUE(tokenizer) << system.render(tokenizer.error()) << "\nnode log:\n" << node_->log();
  caf::anon_send_exit(*tokenizer, caf::exit_reason::user_shutdown);
}

// The same one-step plan, run by a worker remote-spawned from a worker_spec and by a model_runner
// over a model loaded here from the same spec, samples the same token.
TEST_F(remote_stage_e2e, a_remotely_spawned_worker_runs_a_step_plan_like_a_local_runner) {
  controller_config config(controller_files_);
  caf::actor_system system(config);
  auto agent = caf::openssl::remote_actor(system, "127.0.0.1", node_->port());
  ASSERT_TRUE(agent) << system.render(agent.error()) << "\nnode log:\n" << node_->log();

  model_spec model;
  model.path = stories_dir;
  model.device = device_request::cpu;
  model.backend.threads = 1;
  model.num_kv_blocks = 16;
  model.max_num_seqs = 2;
  auto worker = system.middleman().remote_spawn<worker_handle>((*agent)->node(), "worker",
                                                               caf::make_message(worker_spec{model}), request_timeout);
  ASSERT_TRUE(worker) << system.render(worker.error()) << "\nnode log:\n" << node_->log();

  auto tok = load_model_tokenizer(stories_dir);
  scheduled_sequence entry;
  entry.request_id = 1;
  entry.new_token_ids = tok->encode("Once upon a time, there was a little");
  entry.block_table = {3, 5, 7};  // scattered on purpose: the plan's blocks, not the pool's first ones
  entry.sample = true;
  sampling_params greedy;
  greedy.temperature = 0.0f;
  entry.params = greedy;
  step_plan plan;
  plan.step_id = 1;
  plan.sequences = {entry};

  caf::scoped_actor self(system);
  std::optional<step_done> remote;
  self->request(*worker, request_timeout, plan)
      .receive([&](step_done& done) { remote = std::move(done); },
               [&](caf::error& e) {
                 ADD_FAILURE() << "step_plan: " << system.render(e) << "\nnode log:\n" << node_->log();
               });
  ASSERT_TRUE(remote);
  EXPECT_EQ(remote->error, "");
  ASSERT_EQ(remote->result.tokens.size(), 1u);

  auto local = load_served_model(model);
  model_runner runner(*local->backend_model);
  const step_result expected = runner.run(plan);
  ASSERT_EQ(expected.tokens.size(), 1u);
  EXPECT_EQ(remote->result.step_id, 1u);
  EXPECT_EQ(remote->result.tokens[0].request_id, 1);
  EXPECT_EQ(remote->result.tokens[0].token_id, expected.tokens[0].token_id);

  auto answer = ping(system, *agent);
  ASSERT_TRUE(answer);
  EXPECT_EQ(answer->stages, std::vector<std::string>{"worker"});
  // The worker's node maps the weights it loaded.
  EXPECT_TRUE(node_->maps(stories_root / "hf" / "model.safetensors"));
  caf::anon_send_exit(*worker, caf::exit_reason::user_shutdown);
}

TEST_F(remote_stage_e2e, a_stage_whose_spec_names_a_missing_file_ends_and_the_node_keeps_serving) {
  controller_config config(controller_files_);
  caf::actor_system system(config);
  auto agent = caf::openssl::remote_actor(system, "127.0.0.1", node_->port());
  ASSERT_TRUE(agent) << system.render(agent.error());
  caf::scoped_actor self(system);
  tokenizer_spec spec{"/nonexistent/troupe-model", 512, 512, caf::actor_cast<router_handle>(self),
                      caf::actor_cast<frontend_handle>(self)};
  auto tokenizer = system.middleman().remote_spawn<tokenizer_handle>((*agent)->node(), "tokenizer",
                                                                     caf::make_message(spec), request_timeout);
  ASSERT_TRUE(tokenizer) << system.render(tokenizer.error());
  // The stage fails loading, on the node: it refuses its placement, answering its placer's first
  // question with the reason (naming the file), and then ends.
  std::string refusal;
  std::optional<error_code> code;
  self->request(*tokenizer, request_timeout, loaded_atom::value)
      .receive([&](bool) { refusal = "loaded"; },
               [&](caf::error& e) {
                 refusal = system.render(e);
                 if (e.category() == error_category) code = wire_code_of(e);
               });
  EXPECT_NE(refusal.find("this node cannot run the tokenizer"), std::string::npos) << refusal;
  // The node's error crosses as the project's: its code survives, and this process renders it.
  EXPECT_EQ(code, error_code::unavailable) << refusal;
  EXPECT_EQ(refusal.rfind("unavailable: this node cannot run the tokenizer", 0), 0u) << refusal;
  EXPECT_NE(refusal.find("/nonexistent/troupe-model"), std::string::npos) << refusal;
  EXPECT_TRUE(log_shows(*node_, "stage tokenizer ended")) << node_->log();
  EXPECT_NE(node_->log().find("/nonexistent/troupe-model"), std::string::npos) << node_->log();
  auto answer = ping(system, *agent);
  ASSERT_TRUE(answer);
  EXPECT_TRUE(answer->stages.empty());
  EXPECT_TRUE(node_->alive());
}

TEST_F(remote_stage_e2e, a_member_of_another_ca_is_refused_and_the_node_keeps_serving) {
  scratch_dir theirs;
  const run_result made = run_troupe("certs --out " + shell_quote(theirs.path().string()) + " --name intruder");
  ASSERT_EQ(made.exit_code, 0) << made.err;
  member_credentials stranger = credentials_in(theirs.path(), "intruder");
  // The stranger trusts our CA, so only the node's check of the stranger's certificate can refuse it.
  stranger.ca_certificate = controller_files_.ca_certificate;
  {
    controller_config config(stranger);
    caf::actor_system system(config);
    auto agent = caf::openssl::remote_actor(system, "127.0.0.1", node_->port());
    EXPECT_FALSE(agent) << "a certificate from another CA was accepted";
  }
  ASSERT_TRUE(node_->alive()) << node_->log();
  controller_config config(controller_files_);
  caf::actor_system system(config);
  auto agent = caf::openssl::remote_actor(system, "127.0.0.1", node_->port());
  ASSERT_TRUE(agent) << system.render(agent.error()) << "\nnode log:\n" << node_->log();
  auto answer = ping(system, *agent);
  ASSERT_TRUE(answer);
  EXPECT_EQ(answer->name, "node1");
}

// A node without credentials does not start: there is no plaintext mode.
TEST(remote_node_e2e, a_node_without_credentials_refuses_to_start) {
  const run_result r = run_troupe("node --listen 127.0.0.1:0 --name node1 2>&1");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("--credentials is required: nodes authenticate with mutual TLS (troupe certs)"),
            std::string::npos)
      << r.out;
}

}  // namespace
}  // namespace troupe::test
