// Every message type the node registers (stages/message_types.hpp) round-trips CAF's binary
// serializer with every field set to a non-default value, optionals both set and unset. The
// comparison goes field by field over the structs themselves, so a field an inspect overload
// leaves out comes back as its default and fails here: that is what would break a stage on
// another node.

#include <gtest/gtest.h>

#include <bit>
#include <limits>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/binary_deserializer.hpp>
#include <caf/binary_serializer.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/send.hpp>

#include "stages/message_inspect.hpp"
#include "stages/message_types.hpp"

namespace troupe {
namespace {

template <class T>
using of = std::type_identity<T>;

// -- samples: every field non-default -------------------------------------------------------------

std::vector<chat_message> samples(of<chat_message>) { return {{"assistant", "Once upon a time"}}; }

sampling_params full_params() {
  sampling_params p;
  p.temperature = 0.7f;
  p.top_k = 40;
  p.top_p = 0.9f;
  p.min_p = 0.05f;
  p.repetition_penalty = 1.1f;
  p.presence_penalty = 0.3f;
  p.frequency_penalty = -0.2f;
  p.seed = 1234567890123ull;
  p.max_tokens = 77;
  p.stop_token_ids = {2, 13};
  p.stop = {"\n\n", "The end"};
  p.ignore_eos = true;
  p.logprobs = 3;
  p.prompt_logprobs = 5;
  p.logit_bias = {{5, -100.0f}, {17, 2.5f}};
  p.skip_special_tokens = false;
  p.pooling = pooling_kind::mean;
  p.normalize_embedding = false;
  p.logits_plugins = {"banned_phrases", "other"};
  return p;
}

std::vector<sampling_params> samples(of<sampling_params>) {
  sampling_params unseeded = full_params();
  unseeded.seed.reset();
  return {full_params(), unseeded};
}

scheduled_sequence full_entry() {
  scheduled_sequence s;
  s.request_id = 42;
  s.num_computed_tokens = 17;
  s.new_token_ids = {5, 6, -1};
  s.input_from_previous_sample = true;
  s.block_table_start = 2;
  s.block_table = {9, 3};
  s.sample = true;
  s.output_index = 4;
  s.params = full_params();
  s.penalty_token_ids = {1, 5, 6, 7};
  s.num_prompt_tokens = 3;
  s.kv_send_transfer_id = 0xabcdef01ull;
  return s;
}

std::vector<scheduled_sequence> samples(of<scheduled_sequence>) {
  scheduled_sequence without_params = full_entry();
  without_params.params.reset();
  return {full_entry(), without_params};
}

std::vector<step_plan> samples(of<step_plan>) {
  step_plan p;
  p.step_id = 99;
  p.sequences = samples(of<scheduled_sequence>{});
  p.preempted_ids = {7, 8};
  p.finished_ids = {11};
  return {p};
}

sampled_token full_token() {
  sampled_token t{42, 311, -1.25f, {311, 12}, {-1.25f, -2.5f}};
  t.num_drafts = 2;
  t.embedding = {0.5f, -0.125f, 3.0f};
  t.prompt_logprobs = {{403, -2.25f, 3, {7, 403}, {-0.5f, -2.25f}}};
  return t;
}
std::vector<sampled_token> samples(of<sampled_token>) { return {full_token()}; }

std::vector<step_result> samples(of<step_result>) {
  step_result r;
  r.step_id = 98;
  r.tokens = {full_token(), {43, 7, -0.5f, {}, {}}};
  r.failed = {{43, "plugin 'banned_phrases' failed in its logits hook: no"}};
  return {r, step_result{}};
}

token_logprobs full_logprobs() { return {-0.75f, {4, 9}, {-0.75f, -1.5f}}; }
std::vector<token_logprobs> samples(of<token_logprobs>) { return {full_logprobs()}; }

prompt_token_logprob full_prompt_logprob() { return {261, -3.5f, 4, {5, 6, 7}, {-0.25f, -1.0f, -2.0f}}; }
std::vector<prompt_token_logprob> samples(of<prompt_token_logprob>) { return {full_prompt_logprob()}; }

request_metrics full_metrics() { return {0.5, 1.5, 0.025, 3.25, 12, 34, 8, 2}; }
std::vector<request_metrics> samples(of<request_metrics>) { return {full_metrics()}; }

token_delta full_delta() {
  token_delta d;
  d.request_id = 42;
  d.token_ids = {311, 2};
  d.logprobs = {full_logprobs(), full_logprobs()};
  d.finish = finish_reason::length;
  d.metrics = full_metrics();
  d.stop = {"STOP"};
  d.skip_special_tokens = false;
  d.embedding = {0.25f, -1.5f};
  d.prompt_logprobs = {full_prompt_logprob(), full_prompt_logprob()};
  d.attempt = 3;
  return d;
}

std::vector<token_delta> samples(of<token_delta>) {
  token_delta unfinished = full_delta();
  unfinished.metrics.reset();
  unfinished.handed_off = true;
  unfinished.kv_transfer_id = 0x55aa55aa55ull;
  return {full_delta(), unfinished};
}

std::vector<tokenize_request> samples(of<tokenize_request>) {
  tokenize_request r;
  r.request_id = 42;
  r.kind = prompt_kind::messages;
  r.prompt = "Lily";
  r.prompt_token_ids = {1, 2, 3};
  r.messages = samples(of<chat_message>{});
  r.sampling = full_params();
  r.priority = -3;
  r.targets = service_targets{"tenant-x", 120.5, 30};
  return {r};
}

std::vector<schedule_request> samples(of<schedule_request>) {
  schedule_request r;
  r.request_id = 42;
  r.prompt_ids = {1, 2, 3};
  r.sampling = full_params();
  r.priority = 5;
  r.targets = service_targets{"tenant-y", 800, 25.5};
  r.tokenize_ns = 2000;
  r.resumed_output_ids = {7, 8};
  r.kv = kv_handoff{kv_role::receive, 0x1234567890ull, "<prefill KV agent> 17@0123abcd#4711"};
  r.attempt = 2;
  return {r};
}

std::vector<step_done> samples(of<step_done>) {
  step_done d;
  d.result = samples(of<step_result>{}).front();
  d.compute_ns = 10;
  d.error = "device lost";
  return {d};
}

request_timeline full_timeline() { return {1, 2, 3, 4, 5, 6, 7, 8, 9}; }
std::vector<request_timeline> samples(of<request_timeline>) { return {full_timeline()}; }

request_failed full_failure() { return {42, error_code::overloaded, "the waiting queue is full"}; }

engine_load full_load() { return {10, 64, 3, 4, 2.5e-5}; }
std::vector<engine_load> samples(of<engine_load>) { return {full_load()}; }

std::vector<token_batch> samples(of<token_batch>) {
  token_batch b;
  b.load = full_load();
  b.deltas = samples(of<token_delta>{});
  b.timelines = {full_timeline(), request_timeline{}};
  b.failures = {full_failure()};
  return {b};
}

std::vector<text_delta> samples(of<text_delta>) { return {{full_delta(), "Once", full_timeline()}}; }
std::vector<text_batch> samples(of<text_batch>) { return {{samples(of<text_delta>{})}}; }
std::vector<abort_request_msg> samples(of<abort_request_msg>) { return {{42}, {43, true}}; }
std::vector<stop_request_msg> samples(of<stop_request_msg>) { return {{43}}; }
std::vector<detokenizer_resume_msg> samples(of<detokenizer_resume_msg>) {
  return {{44, {"\n\n", "END"}, false, {5, 6, 7}}, {45, {}, true, {}}};
}
std::vector<stage_failure_drill> samples(of<stage_failure_drill>) { return {{"drill"}}; }
std::vector<stats_query> samples(of<stats_query>) { return {{77}}; }
std::vector<std::vector<int32_t>> samples(of<std::vector<int32_t>>) { return {{0, 3, 2147483647}, {}}; }
std::vector<step_model_report> samples(of<step_model_report>) {
  return {{3, "prefill", {2e-3, 5e-5, 1e-4, 2e-7, 1e-8}, 16, 1.5e-3, 4.5e-4, 1234}, {0, "mixed", {}, 1, 0, 0, 0}};
}
std::vector<process_cpu_report> samples(of<process_cpu_report>) {
  return {{"decode-node:4242", 12.5, 9.25}, {"", 0, 0}};
}
std::vector<stats_answer> samples(of<stats_answer>) {
  stats_answer with_models{79, 1, 2, 3, 4, "", 0, 0};
  with_models.num_slo_rejections = 17;
  with_models.pipeline_busy = "0-1:41.2%,2-4:38.0%";
  with_models.num_overload_refusals = 23;
  with_models.step_models = samples(of<step_model_report>{});
  with_models.processes = samples(of<process_cpu_report>{});
  return {{77, 10, 64, 3, 4, "", 2, 5},
          {78, 0, 0, 0, 0, "the node is out of service: the scheduler stage failed"},
          with_models};
}
std::vector<service_targets> samples(of<service_targets>) { return {{}, {"tenant-z", 0.5, 1e6}}; }
// The peer (kv_transport nccl keys a communicator by it) at its size limit, bytes of any value.
std::string longest_peer() {
  std::string peer(max_kv_peer_bytes, '\0');
  for (size_t i = 0; i < peer.size(); ++i) peer[i] = static_cast<char>(i * 13);
  return peer;
}
std::vector<kv_handoff> samples(of<kv_handoff>) {
  return {
      {kv_role::send, 99, ""}, {kv_role::receive, ~0ull, "17@0123abcd#4711"}, {kv_role::receive, 1, longest_peer()}};
}
std::vector<kv_reservation> samples(of<kv_reservation>) {
  return {{42, 7, {3, 9, 1}, 40, ""}, {43, 8, {2}, 3, longest_peer()}};
}
std::vector<kv_expect_msg> samples(of<kv_expect_msg>) { return {{{42, 7, {3, 9}, 20, "17@0123abcd#4711"}, 10000}}; }
// A zmq destination, and a cuda_ipc one with a pool handle (binary bytes, NULs included) at the
// size limit and the decode side's blocks.
std::vector<kv_ready_msg> samples(of<kv_ready_msg>) {
  kv_ready_msg in_place{42, 7, "tcp://127.0.0.1:4711", "", std::string(max_kv_pool_handle_bytes, '\0'), {11, 0, 6}};
  for (size_t i = 0; i < in_place.kv_pool_handle.size(); ++i) in_place.kv_pool_handle[i] = static_cast<char>(i * 7);
  kv_ready_msg stage_routes{42,
                            7,
                            "tcp://127.0.0.1:4711",
                            "",
                            "",
                            {},
                            {"0-1\nkvtcp://127.0.0.1:7112\n", "2-3\ntcp://10.0.0.2:7113\n" + std::string(40, 'k')}};
  return {{42, 7, "tcp://127.0.0.1:4711", "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"}, in_place, stage_routes};
}
std::vector<kv_arrival_msg> samples(of<kv_arrival_msg>) {
  return {{42, 7, true, ""}, {43, 8, false, "deadline passed"}};
}
std::vector<kv_handover_msg> samples(of<kv_handover_msg>) { return {{42, 7, {1000}}}; }
std::vector<kv_failed_msg> samples(of<kv_failed_msg>) { return {{42, 7, "the transfer's deadline passed"}}; }
std::vector<kv_cancel_msg> samples(of<kv_cancel_msg>) { return {{7}}; }
std::vector<kv_lease_counts> samples(of<kv_lease_counts>) { return {{1, 2, 3}}; }
std::vector<request_failed> samples(of<request_failed>) { return {full_failure()}; }

step_event full_step_event() {
  return step_event{3, 77, 1234567, 890123, 456789, 2, 5, 96, 5, {11, 12, 13, 14, 15, 16, 17}};
}
std::vector<step_event> samples(of<step_event>) { return {full_step_event()}; }
std::vector<trace_query> samples(of<trace_query>) { return {trace_query{91, 5'000'000'000}}; }
std::vector<trace_instance> samples(of<trace_instance>) { return {trace_instance{4, "worker-b", 1250}}; }
std::vector<trace_answer> samples(of<trace_answer>) {
  return {
      trace_answer{92, {full_step_event(), full_step_event()}, {trace_instance{4, "worker-b", 1250}}, "none answered"}};
}

// The specs carry actor handles: three live actors of the test's own system, set by the test
// before it takes the samples (a handle serializes as its node and id, so it must exist).
struct sample_handles {
  caf::actor first, second, third;
};
sample_handles handles;
// One of them as a typed stage's handle (stages/stage_interfaces.hpp): only its identity travels,
// so the actor behind it need not have that interface.
template <class Handle>
Handle as(const caf::actor& actor) {
  return caf::actor_cast<Handle>(actor);
}

backend_options full_backend() {
  backend_options b;
  b.threads = 3;
  b.gpu_memory_utilization = 0.55f;
  b.cuda_dtype = dtype::f16;
  b.nano_batches = 2;
  b.kv_cache_dtype = "q8_0";
  b.layers = {16, 0};  // a pipeline's last stage
  return b;
}

model_spec full_model_spec() {
  model_spec m;
  m.path = "/models/stories260K/model.gguf";
  m.format = load_format::gguf;
  m.device = device_request::auto_detect;
  m.backend = full_backend();
  m.block_size = 32;
  m.num_kv_blocks = 77;
  m.kv_memory_mb = 64;
  m.max_model_len = 300;
  m.max_num_seqs = 9;
  m.memory_budget_mb = 2048;
  return m;
}

engine_config full_engine_config() {
  engine_config c;
  c.block_size = 32;
  c.num_kv_blocks = 77;
  c.max_num_batched_tokens = 333;
  c.max_num_seqs = 9;
  c.max_waiting_requests = 44;
  c.max_model_len = 300;
  c.enable_prefix_caching = false;
  c.async_scheduling = true;
  c.vocab_size = 512;
  c.hidden_size = 64;
  c.scheduling_policy = scheduling_policy_kind::fair;
  c.slo_admission = slo_admission_mode::reject;
  return c;
}

std::vector<backend_options> samples(of<backend_options>) { return {full_backend()}; }
std::vector<model_spec> samples(of<model_spec>) { return {full_model_spec()}; }
std::vector<engine_config> samples(of<engine_config>) { return {full_engine_config()}; }
plugin_spec sample_plugin() {
  return {"quota", "/opt/plugins/libquota.so", R"({"tokens_per_key": 7})", {"request", "output"}, 75};
}
std::vector<tokenizer_spec> samples(of<tokenizer_spec>) {
  return {{"/models/stories260K/hf",
           512,
           300,
           as<router_handle>(handles.first),
           as<frontend_handle>(handles.second),
           {sample_plugin()}}};
}
std::vector<worker_spec> samples(of<worker_spec>) {
  worker_spec spec{full_model_spec()};
  spec.kv_bind_host = "10.0.0.7";
  spec.kv_transfer_timeout_ms = 2500;
  spec.draft_model = full_model_spec();
  spec.draft_model.path = "/models/draft/config.json";
  spec.ngram = {1, 5, 300};
  spec.kv_transport = kv_transport::cuda_ipc;
  spec.pipeline.stages = {{"kvtcp://127.0.0.1:7101", {0, 8}},
                          {"curve://10.0.0.2:7102/" + std::string(40, 'k'), {8, 16}}};
  spec.pipeline.micro_batches = 3;
  spec.pipeline.step_timeout_ms = 1234;
  spec.pipeline.connect_timeout_ms = 567;
  spec.pipeline.kv_stage_pairs = true;
  spec.plugins = {sample_plugin()};
  return {spec, worker_spec{full_model_spec()}};
}
std::vector<worker_description> samples(of<worker_description>) {
  // Pushed one by one: an initializer list of this type trips GCC 12's -Wfree-nonheap-object.
  std::vector<worker_description> all;
  all.push_back({full_engine_config(), {2, 7}, "stories260K: 5 layers", "Q4_K_M", as<kv_agent_handle>(handles.third)});
  return all;
}
std::vector<scheduler_spec> samples(of<scheduler_spec>) {
  scheduler_spec spec{
      full_engine_config(), {2, 7}, as<worker_handle>(handles.first), as<router_handle>(handles.second)};
  spec.kv_agent = as<kv_agent_handle>(handles.third);
  spec.kv_transfer_timeout_ms = 2500;
  return {spec};
}
std::vector<scheduler_handle> samples(of<scheduler_handle>) { return {as<scheduler_handle>(handles.first), {}}; }
std::vector<worker_handle> samples(of<worker_handle>) { return {as<worker_handle>(handles.second)}; }
std::vector<kv_agent_handle> samples(of<kv_agent_handle>) { return {as<kv_agent_handle>(handles.third)}; }
std::vector<detokenizer_handle> samples(of<detokenizer_handle>) { return {as<detokenizer_handle>(handles.first)}; }
std::vector<std::vector<detokenizer_handle>> samples(of<std::vector<detokenizer_handle>>) {
  return {{as<detokenizer_handle>(handles.first), as<detokenizer_handle>(handles.second)}, {}};
}
std::vector<std::vector<int64_t>> samples(of<std::vector<int64_t>>) { return {{0, -1, int64_t{1} << 62}, {}}; }
std::vector<detokenizer_spec> samples(of<detokenizer_spec>) {
  return {{"/models/stories260K/hf", as<frontend_handle>(handles.third), {sample_plugin(), plugin_spec{"", "/p.so"}}}};
}

// -- field-by-field equality ------------------------------------------------------------------------

template <class T>
void expect_same_list(const std::vector<T>& a, const std::vector<T>& b);

void expect_same(const std::vector<int32_t>& a, const std::vector<int32_t>& b) { EXPECT_EQ(a, b); }
void expect_same(const std::vector<int64_t>& a, const std::vector<int64_t>& b) { EXPECT_EQ(a, b); }
// A typed handle comes back as the same actor (or none).
template <class... Sigs>
void expect_same(const caf::typed_actor<Sigs...>& a, const caf::typed_actor<Sigs...>& b) {
  EXPECT_TRUE(a == b) << caf::to_string(a.address()) << " came back as " << caf::to_string(b.address());
}
void expect_same(const std::vector<detokenizer_handle>& a, const std::vector<detokenizer_handle>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) expect_same(a[i], b[i]);
}
void expect_same(const chat_message& a, const chat_message& b) {
  EXPECT_EQ(a.role, b.role);
  EXPECT_EQ(a.content, b.content);
}

void expect_same(const sampling_params& a, const sampling_params& b) {
  EXPECT_EQ(a.temperature, b.temperature);
  EXPECT_EQ(a.top_k, b.top_k);
  EXPECT_EQ(a.top_p, b.top_p);
  EXPECT_EQ(a.min_p, b.min_p);
  EXPECT_EQ(a.repetition_penalty, b.repetition_penalty);
  EXPECT_EQ(a.presence_penalty, b.presence_penalty);
  EXPECT_EQ(a.frequency_penalty, b.frequency_penalty);
  EXPECT_EQ(a.seed, b.seed);
  EXPECT_EQ(a.max_tokens, b.max_tokens);
  EXPECT_EQ(a.stop_token_ids, b.stop_token_ids);
  EXPECT_EQ(a.stop, b.stop);
  EXPECT_EQ(a.ignore_eos, b.ignore_eos);
  EXPECT_EQ(a.logprobs, b.logprobs);
  EXPECT_EQ(a.prompt_logprobs, b.prompt_logprobs);
  ASSERT_EQ(a.logit_bias.size(), b.logit_bias.size());
  for (size_t i = 0; i < a.logit_bias.size(); ++i) {
    EXPECT_EQ(a.logit_bias[i].token_id, b.logit_bias[i].token_id);
    EXPECT_EQ(a.logit_bias[i].bias, b.logit_bias[i].bias);
  }
  EXPECT_EQ(a.skip_special_tokens, b.skip_special_tokens);
  EXPECT_EQ(a.pooling, b.pooling);
  EXPECT_EQ(a.normalize_embedding, b.normalize_embedding);
  EXPECT_EQ(a.logits_plugins, b.logits_plugins);
}

void expect_same(const scheduled_sequence& a, const scheduled_sequence& b) {
  EXPECT_EQ(a.request_id, b.request_id);
  EXPECT_EQ(a.num_computed_tokens, b.num_computed_tokens);
  EXPECT_EQ(a.new_token_ids, b.new_token_ids);
  EXPECT_EQ(a.input_from_previous_sample, b.input_from_previous_sample);
  EXPECT_EQ(a.block_table_start, b.block_table_start);
  EXPECT_EQ(a.block_table, b.block_table);
  EXPECT_EQ(a.sample, b.sample);
  EXPECT_EQ(a.output_index, b.output_index);
  ASSERT_EQ(a.params.has_value(), b.params.has_value());
  if (a.params) expect_same(*a.params, *b.params);
  EXPECT_EQ(a.penalty_token_ids, b.penalty_token_ids);
  EXPECT_EQ(a.num_prompt_tokens, b.num_prompt_tokens);
  EXPECT_EQ(a.kv_send_transfer_id, b.kv_send_transfer_id);
}

void expect_same(const step_plan& a, const step_plan& b) {
  EXPECT_EQ(a.step_id, b.step_id);
  expect_same_list(a.sequences, b.sequences);
  EXPECT_EQ(a.preempted_ids, b.preempted_ids);
  EXPECT_EQ(a.finished_ids, b.finished_ids);
}

void expect_same(const sampled_token& a, const sampled_token& b) {
  EXPECT_EQ(a.request_id, b.request_id);
  EXPECT_EQ(a.token_id, b.token_id);
  EXPECT_EQ(a.logprob, b.logprob);
  EXPECT_EQ(a.top_token_ids, b.top_token_ids);
  EXPECT_EQ(a.top_logprobs, b.top_logprobs);
  EXPECT_EQ(a.embedding, b.embedding);
  expect_same_list(a.prompt_logprobs, b.prompt_logprobs);
}

void expect_same(const step_result& a, const step_result& b) {
  EXPECT_EQ(a.step_id, b.step_id);
  expect_same_list(a.tokens, b.tokens);
  ASSERT_EQ(a.failed.size(), b.failed.size());
  for (size_t i = 0; i < a.failed.size(); ++i) {
    EXPECT_EQ(a.failed[i].request_id, b.failed[i].request_id);
    EXPECT_EQ(a.failed[i].why, b.failed[i].why);
  }
}

void expect_same(const token_logprobs& a, const token_logprobs& b) {
  EXPECT_EQ(a.logprob, b.logprob);
  EXPECT_EQ(a.top_token_ids, b.top_token_ids);
  EXPECT_EQ(a.top_logprobs, b.top_logprobs);
}

void expect_same(const prompt_token_logprob& a, const prompt_token_logprob& b) {
  EXPECT_EQ(a.token_id, b.token_id);
  EXPECT_EQ(a.logprob, b.logprob);
  EXPECT_EQ(a.rank, b.rank);
  EXPECT_EQ(a.top_token_ids, b.top_token_ids);
  EXPECT_EQ(a.top_logprobs, b.top_logprobs);
}

void expect_same(const request_metrics& a, const request_metrics& b) {
  EXPECT_EQ(a.queue_time, b.queue_time);
  EXPECT_EQ(a.ttft, b.ttft);
  EXPECT_EQ(a.tpot, b.tpot);
  EXPECT_EQ(a.e2e, b.e2e);
  EXPECT_EQ(a.num_prompt_tokens, b.num_prompt_tokens);
  EXPECT_EQ(a.num_output_tokens, b.num_output_tokens);
  EXPECT_EQ(a.num_cached_tokens, b.num_cached_tokens);
  EXPECT_EQ(a.num_preemptions, b.num_preemptions);
}

void expect_same(const token_delta& a, const token_delta& b) {
  EXPECT_EQ(a.request_id, b.request_id);
  EXPECT_EQ(a.token_ids, b.token_ids);
  expect_same_list(a.logprobs, b.logprobs);
  EXPECT_EQ(a.finish, b.finish);
  EXPECT_EQ(a.handed_off, b.handed_off);
  EXPECT_EQ(a.kv_transfer_id, b.kv_transfer_id);
  ASSERT_EQ(a.metrics.has_value(), b.metrics.has_value());
  if (a.metrics) expect_same(*a.metrics, *b.metrics);
  EXPECT_EQ(a.stop, b.stop);
  EXPECT_EQ(a.skip_special_tokens, b.skip_special_tokens);
  EXPECT_EQ(a.embedding, b.embedding);
  expect_same_list(a.prompt_logprobs, b.prompt_logprobs);
  EXPECT_EQ(a.attempt, b.attempt);
}

void expect_same(const tokenize_request& a, const tokenize_request& b) {
  EXPECT_EQ(a.request_id, b.request_id);
  EXPECT_EQ(a.kind, b.kind);
  EXPECT_EQ(a.prompt, b.prompt);
  EXPECT_EQ(a.prompt_token_ids, b.prompt_token_ids);
  expect_same_list(a.messages, b.messages);
  expect_same(a.sampling, b.sampling);
  EXPECT_EQ(a.priority, b.priority);
  EXPECT_EQ(a.targets.tenant, b.targets.tenant);
  EXPECT_EQ(a.targets.ttft_ms, b.targets.ttft_ms);
  EXPECT_EQ(a.targets.tpot_ms, b.targets.tpot_ms);
}

void expect_same(const schedule_request& a, const schedule_request& b) {
  EXPECT_EQ(a.request_id, b.request_id);
  EXPECT_EQ(a.prompt_ids, b.prompt_ids);
  expect_same(a.sampling, b.sampling);
  EXPECT_EQ(a.priority, b.priority);
  EXPECT_EQ(a.targets.tenant, b.targets.tenant);
  EXPECT_EQ(a.targets.ttft_ms, b.targets.ttft_ms);
  EXPECT_EQ(a.targets.tpot_ms, b.targets.tpot_ms);
  EXPECT_EQ(a.tokenize_ns, b.tokenize_ns);
  EXPECT_EQ(a.resumed_output_ids, b.resumed_output_ids);
  EXPECT_EQ(a.kv.role, b.kv.role);
  EXPECT_EQ(a.kv.transfer_id, b.kv.transfer_id);
  EXPECT_EQ(a.kv.peer, b.kv.peer);
  EXPECT_EQ(a.attempt, b.attempt);
}

void expect_same(const kv_handoff& a, const kv_handoff& b) {
  EXPECT_EQ(a.role, b.role);
  EXPECT_EQ(a.transfer_id, b.transfer_id);
  EXPECT_EQ(a.peer, b.peer);
}
void expect_same(const kv_reservation& a, const kv_reservation& b) {
  EXPECT_EQ(a.request_id, b.request_id);
  EXPECT_EQ(a.transfer_id, b.transfer_id);
  EXPECT_EQ(a.block_ids, b.block_ids);
  EXPECT_EQ(a.num_tokens, b.num_tokens);
  EXPECT_EQ(a.peer, b.peer);
}
void expect_same(const kv_expect_msg& a, const kv_expect_msg& b) {
  expect_same(a.reservation, b.reservation);
  EXPECT_EQ(a.timeout_ms, b.timeout_ms);
}
void expect_same(const kv_ready_msg& a, const kv_ready_msg& b) {
  EXPECT_EQ(a.request_id, b.request_id);
  EXPECT_EQ(a.transfer_id, b.transfer_id);
  EXPECT_EQ(a.endpoint, b.endpoint);
  EXPECT_EQ(a.public_key, b.public_key);
  EXPECT_EQ(a.kv_pool_handle, b.kv_pool_handle);
  EXPECT_EQ(a.block_ids, b.block_ids);
  EXPECT_EQ(a.stage_routes, b.stage_routes);
}
void expect_same(const kv_arrival_msg& a, const kv_arrival_msg& b) {
  EXPECT_EQ(a.request_id, b.request_id);
  EXPECT_EQ(a.transfer_id, b.transfer_id);
  EXPECT_EQ(a.ok, b.ok);
  EXPECT_EQ(a.why, b.why);
}
void expect_same(const kv_handover_msg& a, const kv_handover_msg& b) {
  EXPECT_EQ(a.request_id, b.request_id);
  EXPECT_EQ(a.transfer_id, b.transfer_id);
  EXPECT_EQ(a.token_ids, b.token_ids);
}
void expect_same(const kv_failed_msg& a, const kv_failed_msg& b) {
  EXPECT_EQ(a.request_id, b.request_id);
  EXPECT_EQ(a.transfer_id, b.transfer_id);
  EXPECT_EQ(a.why, b.why);
}
void expect_same(const kv_cancel_msg& a, const kv_cancel_msg& b) { EXPECT_EQ(a.transfer_id, b.transfer_id); }
void expect_same(const kv_lease_counts& a, const kv_lease_counts& b) {
  EXPECT_EQ(a.num_expected, b.num_expected);
  EXPECT_EQ(a.num_sending, b.num_sending);
  EXPECT_EQ(a.num_refused_frames, b.num_refused_frames);
}

void expect_same(const engine_load& a, const engine_load& b) {
  EXPECT_EQ(a.num_free_blocks, b.num_free_blocks);
  EXPECT_EQ(a.num_total_blocks, b.num_total_blocks);
  EXPECT_EQ(a.num_running, b.num_running);
  EXPECT_EQ(a.num_waiting, b.num_waiting);
  EXPECT_EQ(a.seconds_per_prompt_token, b.seconds_per_prompt_token);
}

void expect_same(const step_done& a, const step_done& b) {
  expect_same(a.result, b.result);
  EXPECT_EQ(a.compute_ns, b.compute_ns);
  EXPECT_EQ(a.error, b.error);
}

void expect_same(const request_timeline& a, const request_timeline& b) {
  EXPECT_EQ(a.tokenize_ns, b.tokenize_ns);
  EXPECT_EQ(a.queue_ns, b.queue_ns);
  EXPECT_EQ(a.first_step_done_ns, b.first_step_done_ns);
  EXPECT_EQ(a.last_step_done_ns, b.last_step_done_ns);
  EXPECT_EQ(a.first_step_compute_ns, b.first_step_compute_ns);
  EXPECT_EQ(a.num_steps, b.num_steps);
  EXPECT_EQ(a.kv_reserved_ns, b.kv_reserved_ns);
  EXPECT_EQ(a.kv_landed_ns, b.kv_landed_ns);
  EXPECT_EQ(a.instance, b.instance);
}

void expect_same(const step_event& a, const step_event& b) {
  EXPECT_EQ(a.instance, b.instance);
  EXPECT_EQ(a.step_id, b.step_id);
  EXPECT_EQ(a.age_ns, b.age_ns);
  EXPECT_EQ(a.elapsed_ns, b.elapsed_ns);
  EXPECT_EQ(a.compute_ns, b.compute_ns);
  EXPECT_EQ(a.num_prefill_sequences, b.num_prefill_sequences);
  EXPECT_EQ(a.num_decode_sequences, b.num_decode_sequences);
  EXPECT_EQ(a.num_prefill_tokens, b.num_prefill_tokens);
  EXPECT_EQ(a.num_decode_tokens, b.num_decode_tokens);
  EXPECT_EQ(a.request_ids, b.request_ids);
}

void expect_same(const trace_query& a, const trace_query& b) {
  EXPECT_EQ(a.tag, b.tag);
  EXPECT_EQ(a.window_ns, b.window_ns);
}

void expect_same(const trace_instance& a, const trace_instance& b) {
  EXPECT_EQ(a.instance, b.instance);
  EXPECT_EQ(a.node, b.node);
}

void expect_same(const trace_answer& a, const trace_answer& b);

void expect_same(const request_failed& a, const request_failed& b) {
  EXPECT_EQ(a.request_id, b.request_id);
  EXPECT_EQ(a.code, b.code);
  EXPECT_EQ(a.message, b.message);
}

void expect_same(const backend_options& a, const backend_options& b) {
  EXPECT_EQ(a.threads, b.threads);
  EXPECT_EQ(a.gpu_memory_utilization, b.gpu_memory_utilization);
  EXPECT_EQ(a.cuda_dtype, b.cuda_dtype);
  EXPECT_EQ(a.nano_batches, b.nano_batches);
  EXPECT_EQ(a.kv_cache_dtype, b.kv_cache_dtype);
  EXPECT_EQ(a.layers, b.layers);
}

void expect_same(const model_spec& a, const model_spec& b) {
  EXPECT_EQ(a.path, b.path);
  EXPECT_EQ(a.format, b.format);
  EXPECT_EQ(a.device, b.device);
  expect_same(a.backend, b.backend);
  EXPECT_EQ(a.block_size, b.block_size);
  EXPECT_EQ(a.num_kv_blocks, b.num_kv_blocks);
  EXPECT_EQ(a.kv_memory_mb, b.kv_memory_mb);
  EXPECT_EQ(a.max_model_len, b.max_model_len);
  EXPECT_EQ(a.max_num_seqs, b.max_num_seqs);
  EXPECT_EQ(a.memory_budget_mb, b.memory_budget_mb);
}

void expect_same(const engine_config& a, const engine_config& b) {
  EXPECT_EQ(a.block_size, b.block_size);
  EXPECT_EQ(a.num_kv_blocks, b.num_kv_blocks);
  EXPECT_EQ(a.max_num_batched_tokens, b.max_num_batched_tokens);
  EXPECT_EQ(a.max_num_seqs, b.max_num_seqs);
  EXPECT_EQ(a.max_waiting_requests, b.max_waiting_requests);
  EXPECT_EQ(a.max_model_len, b.max_model_len);
  EXPECT_EQ(a.enable_prefix_caching, b.enable_prefix_caching);
  EXPECT_EQ(a.async_scheduling, b.async_scheduling);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.hidden_size, b.hidden_size);
  EXPECT_EQ(a.scheduling_policy, b.scheduling_policy);
  EXPECT_EQ(a.slo_admission, b.slo_admission);
}

// Handles are compared by identity: the same actor must come back, not merely some actor.
void expect_same(const tokenizer_spec& a, const tokenizer_spec& b) {
  EXPECT_EQ(a.tokenizer_path, b.tokenizer_path);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.max_model_len, b.max_model_len);
  EXPECT_EQ(a.router, b.router);
  EXPECT_EQ(a.reply_to, b.reply_to);
  expect_same_list(a.plugins, b.plugins);
}

void expect_same(const plugin_spec& a, const plugin_spec& b) {
  EXPECT_EQ(a.name, b.name);
  EXPECT_EQ(a.library, b.library);
  EXPECT_EQ(a.config_json, b.config_json);
  EXPECT_EQ(a.hooks, b.hooks);
  EXPECT_EQ(a.budget_ms, b.budget_ms);
}

void expect_same(const ngram_settings& a, const ngram_settings& b) {
  EXPECT_EQ(a.min_n, b.min_n);
  EXPECT_EQ(a.max_n, b.max_n);
  EXPECT_EQ(a.max_lookback, b.max_lookback);
}

void expect_same(const worker_spec& a, const worker_spec& b) {
  expect_same(a.model, b.model);
  EXPECT_EQ(a.kv_bind_host, b.kv_bind_host);
  EXPECT_EQ(a.kv_transfer_timeout_ms, b.kv_transfer_timeout_ms);
  expect_same(a.draft_model, b.draft_model);
  expect_same(a.ngram, b.ngram);
  EXPECT_EQ(a.kv_transport, b.kv_transport);
  ASSERT_EQ(a.pipeline.stages.size(), b.pipeline.stages.size());
  for (size_t i = 0; i < a.pipeline.stages.size(); ++i) {
    EXPECT_EQ(a.pipeline.stages[i].endpoint, b.pipeline.stages[i].endpoint);
    EXPECT_EQ(a.pipeline.stages[i].layers, b.pipeline.stages[i].layers);
  }
  EXPECT_EQ(a.pipeline.micro_batches, b.pipeline.micro_batches);
  EXPECT_EQ(a.pipeline.step_timeout_ms, b.pipeline.step_timeout_ms);
  EXPECT_EQ(a.pipeline.connect_timeout_ms, b.pipeline.connect_timeout_ms);
  EXPECT_EQ(a.pipeline.kv_stage_pairs, b.pipeline.kv_stage_pairs);
  expect_same_list(a.plugins, b.plugins);
}

void expect_same(const worker_description& a, const worker_description& b) {
  expect_same(a.config, b.config);
  EXPECT_EQ(a.eos_token_ids, b.eos_token_ids);
  EXPECT_EQ(a.summary, b.summary);
  EXPECT_EQ(a.quantization, b.quantization);
  EXPECT_EQ(a.kv_agent, b.kv_agent);
}

void expect_same(const scheduler_spec& a, const scheduler_spec& b) {
  expect_same(a.config, b.config);
  EXPECT_EQ(a.eos_token_ids, b.eos_token_ids);
  EXPECT_EQ(a.worker, b.worker);
  EXPECT_EQ(a.router, b.router);
  EXPECT_EQ(a.kv_agent, b.kv_agent);
  EXPECT_EQ(a.kv_transfer_timeout_ms, b.kv_transfer_timeout_ms);
}

void expect_same(const detokenizer_spec& a, const detokenizer_spec& b) {
  EXPECT_EQ(a.tokenizer_path, b.tokenizer_path);
  EXPECT_EQ(a.reply_to, b.reply_to);
  expect_same_list(a.plugins, b.plugins);
}

void expect_same(const token_batch& a, const token_batch& b) {
  expect_same_list(a.deltas, b.deltas);
  expect_same_list(a.timelines, b.timelines);
  expect_same_list(a.failures, b.failures);
  expect_same(a.load, b.load);
}

void expect_same(const text_delta& a, const text_delta& b) {
  expect_same(a.delta, b.delta);
  EXPECT_EQ(a.text, b.text);
  expect_same(a.timeline, b.timeline);
}

void expect_same(const text_batch& a, const text_batch& b) { expect_same_list(a.deltas, b.deltas); }
void expect_same(const abort_request_msg& a, const abort_request_msg& b) {
  EXPECT_EQ(a.request_id, b.request_id);
  EXPECT_EQ(a.quietly, b.quietly);
}
void expect_same(const stop_request_msg& a, const stop_request_msg& b) { EXPECT_EQ(a.request_id, b.request_id); }
void expect_same(const detokenizer_resume_msg& a, const detokenizer_resume_msg& b) {
  EXPECT_EQ(a.request_id, b.request_id);
  EXPECT_EQ(a.stop, b.stop);
  EXPECT_EQ(a.skip_special_tokens, b.skip_special_tokens);
  EXPECT_EQ(a.spelled_ids, b.spelled_ids);
}
void expect_same(const stats_query& a, const stats_query& b) { EXPECT_EQ(a.tag, b.tag); }
void expect_same(const stage_failure_drill& a, const stage_failure_drill& b) { EXPECT_EQ(a.reason, b.reason); }

void expect_same(const service_targets& a, const service_targets& b) {
  EXPECT_EQ(a.tenant, b.tenant);
  EXPECT_EQ(a.ttft_ms, b.ttft_ms);
  EXPECT_EQ(a.tpot_ms, b.tpot_ms);
}

void expect_same(const step_model_report& a, const step_model_report& b) {
  EXPECT_EQ(a.instance, b.instance);
  EXPECT_EQ(a.coefficients, b.coefficients);
  EXPECT_EQ(a.token_floor, b.token_floor);
  EXPECT_EQ(a.min_step_s, b.min_step_s);
  EXPECT_EQ(a.role, b.role);
  EXPECT_EQ(a.rms_error_s, b.rms_error_s);
  EXPECT_EQ(a.num_steps, b.num_steps);
}

void expect_same(const process_cpu_report& a, const process_cpu_report& b) {
  EXPECT_EQ(a.process, b.process);
  EXPECT_EQ(a.total_s, b.total_s);
  EXPECT_EQ(a.compute_s, b.compute_s);
}

void expect_same(const stats_answer& a, const stats_answer& b) {
  EXPECT_EQ(a.tag, b.tag);
  EXPECT_EQ(a.num_free_blocks, b.num_free_blocks);
  EXPECT_EQ(a.num_total_blocks, b.num_total_blocks);
  EXPECT_EQ(a.num_running, b.num_running);
  EXPECT_EQ(a.num_waiting, b.num_waiting);
  EXPECT_EQ(a.unavailable, b.unavailable);
  EXPECT_EQ(a.num_waiting_for_kv, b.num_waiting_for_kv);
  EXPECT_EQ(a.num_kv_leases, b.num_kv_leases);
  EXPECT_EQ(a.num_slo_rejections, b.num_slo_rejections);
  EXPECT_EQ(a.pipeline_busy, b.pipeline_busy);
  EXPECT_EQ(a.num_overload_refusals, b.num_overload_refusals);
  ASSERT_EQ(a.step_models.size(), b.step_models.size());
  for (size_t i = 0; i < a.step_models.size(); ++i) expect_same(a.step_models[i], b.step_models[i]);
  ASSERT_EQ(a.processes.size(), b.processes.size());
  for (size_t i = 0; i < a.processes.size(); ++i) expect_same(a.processes[i], b.processes[i]);
}

template <class T>
void expect_same_list(const std::vector<T>& a, const std::vector<T>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    SCOPED_TRACE("element " + std::to_string(i));
    expect_same(a[i], b[i]);
  }
}

void expect_same(const trace_answer& a, const trace_answer& b) {
  EXPECT_EQ(a.tag, b.tag);
  expect_same_list(a.steps, b.steps);
  expect_same_list(a.instances, b.instances);
  EXPECT_EQ(a.unavailable, b.unavailable);
}

// -- the round trip ---------------------------------------------------------------------------------

template <class T>
T round_trip(caf::actor_system& sys, const T& original) {
  std::vector<char> buf;
  T copy_in = original;  // inspect takes a mutable reference
  caf::binary_serializer sink{sys, buf};
  if (auto error = sink(copy_in)) ADD_FAILURE() << "serializing: " << sys.render(error);
  EXPECT_FALSE(buf.empty());
  T out{};
  caf::binary_deserializer source{sys, buf};
  if (auto error = source(out)) ADD_FAILURE() << "deserializing: " << sys.render(error);
  EXPECT_EQ(source.remaining(), 0u) << "bytes left over";
  return out;
}

TEST(message_serialization, every_registered_type_round_trips_field_by_field) {
  caf::actor_system_config config;
  caf::actor_system sys{config};
  auto idle = [](caf::event_based_actor*) -> caf::behavior { return {[](int32_t) {}}; };
  handles = {sys.spawn(idle), sys.spawn(idle), sys.spawn(idle)};
  std::set<std::string> names;
  int num_types = 0;
  for_each_message_type([&](auto type, const char* name) {
    using T = typename decltype(type)::type;
    SCOPED_TRACE(name);
    EXPECT_TRUE(names.insert(name).second) << "registered twice";
    // samples(type) must exist for every registered type: a type added to the list without a
    // sample and a comparison does not compile.
    const std::vector<T> originals = samples(type);
    ASSERT_FALSE(originals.empty());
    for (size_t i = 0; i < originals.size(); ++i) {
      SCOPED_TRACE("sample " + std::to_string(i));
      expect_same(originals[i], round_trip(sys, originals[i]));
    }
    ++num_types;
  });
  // The node registers exactly this list (node_config calls for_each_message_type).
  EXPECT_EQ(num_types, 56);
  for (auto* handle : {&handles.first, &handles.second, &handles.third}) {
    caf::anon_send_exit(*handle, caf::exit_reason::user_shutdown);
    *handle = nullptr;
  }
}

// What comes from another node is checked as it is read: a kv_ready whose pool handle is larger
// than any handle (a peer that lies, or garbage) is refused naming the field, and a worker_spec
// naming no transport, or an engine_config no scheduling policy, is refused too; none reaches the
// agent, the worker or the scheduler.
TEST(message_serialization, an_oversized_pool_handle_or_an_unknown_transport_is_refused_when_read) {
  caf::actor_system_config config;
  caf::actor_system sys{config};
  auto refused = [&](auto original, const std::string& expected) {
    std::vector<char> buf;
    caf::binary_serializer sink{sys, buf};
    ASSERT_FALSE(sink(original));
    decltype(original) out{};
    caf::binary_deserializer source{sys, buf};
    const caf::error error = source(out);
    ASSERT_TRUE(error) << "accepted: " << expected;
    EXPECT_NE(sys.render(error).find(expected), std::string::npos) << sys.render(error);
  };
  kv_ready_msg ready{42, 7, "tcp://127.0.0.1:4711", "", std::string(max_kv_pool_handle_bytes + 1, 'h'), {1, 2}};
  refused(ready, "kv_ready_msg: a kv_pool_handle of 1025 bytes, at most 1024");
  refused(kv_ready_msg{42, 7, "tcp://127.0.0.1:4711", "", "", {}, {"0-1\nkvtcp://127.0.0.1:7112"}},
          "kv_ready_msg: a KV stage route: expected three lines");
  refused(kv_ready_msg{42, 7, "tcp://127.0.0.1:4711", "", "", {}, std::vector<std::string>(65, "0-1\nkvtcp://h:1\n")},
          "kv_ready_msg: 65 stage routes, at most 64");
  refused(kv_handoff{kv_role::receive, 7, std::string(max_kv_peer_bytes + 1, 'p')},
          "kv_handoff: a peer of 257 bytes, at most 256");
  refused(kv_reservation{42, 7, {1}, 4, std::string(max_kv_peer_bytes + 1, 'p')},
          "kv_reservation: a peer of 257 bytes, at most 256");
  // The transport travels as its number: one past the last is no transport.
  worker_spec spec{full_model_spec()};
  spec.kv_transport = static_cast<kv_transport>(static_cast<uint8_t>(kv_transport::nccl) + 1);
  refused(spec, "worker_spec: kv_transport 3 is not a transport");
  engine_config config_with_no_policy = full_engine_config();
  config_with_no_policy.scheduling_policy = static_cast<scheduling_policy_kind>(9);
  refused(config_with_no_policy, "engine_config: scheduling policy 9 / slo admission 1 is not one the engine knows");
}

}  // namespace
}  // namespace troupe

namespace troupe {
namespace {

uint32_t bits_of(float v) { return std::bit_cast<uint32_t>(v); }
uint64_t bits_of(double v) { return std::bit_cast<uint64_t>(v); }

// Every float and double crosses nodes bit for bit: subnormals, ±0, NaN payloads, infinities and
// the extremes. CAF's own float packing turned top_p 1e-45 into -1.6e32 on the way.
TEST(message_serialization, floats_and_doubles_round_trip_bit_for_bit) {
  caf::actor_system_config config;
  caf::actor_system sys{config};
  const std::vector<float> floats = {1e-45f,
                                     -1e-45f,
                                     1e-40f,
                                     std::numeric_limits<float>::denorm_min(),
                                     std::numeric_limits<float>::min(),
                                     std::numeric_limits<float>::max(),
                                     -std::numeric_limits<float>::max(),
                                     0.0f,
                                     -0.0f,
                                     std::numeric_limits<float>::infinity(),
                                     -std::numeric_limits<float>::infinity(),
                                     std::bit_cast<float>(uint32_t{0x7fc01234}),
                                     std::bit_cast<float>(uint32_t{0xff800001})};
  for (float v : floats) {
    SCOPED_TRACE("bits " + std::to_string(bits_of(v)));
    sampling_params p = full_params();
    p.temperature = v;
    p.top_p = v;
    p.min_p = v;
    p.repetition_penalty = v;
    p.presence_penalty = v;
    p.frequency_penalty = v;
    const sampling_params q = round_trip(sys, p);
    for (float got : {q.temperature, q.top_p, q.min_p, q.repetition_penalty, q.presence_penalty, q.frequency_penalty}) {
      EXPECT_EQ(bits_of(got), bits_of(v));
    }
    sampled_token t;
    t.logprob = v;
    t.top_logprobs = {v, -v, v};
    const sampled_token u = round_trip(sys, t);
    EXPECT_EQ(bits_of(u.logprob), bits_of(v));
    ASSERT_EQ(u.top_logprobs.size(), 3u);
    for (size_t i = 0; i < 3; ++i) EXPECT_EQ(bits_of(u.top_logprobs[i]), bits_of(t.top_logprobs[i]));
    token_logprobs l;
    l.logprob = v;
    l.top_logprobs = {v};
    const token_logprobs m = round_trip(sys, l);
    EXPECT_EQ(bits_of(m.logprob), bits_of(v));
    EXPECT_EQ(bits_of(m.top_logprobs.at(0)), bits_of(v));
    backend_options b;
    b.gpu_memory_utilization = v;
    EXPECT_EQ(bits_of(round_trip(sys, b).gpu_memory_utilization), bits_of(v));
  }
  for (double v : {4.9e-324, -4.9e-324, 1e-310, std::numeric_limits<double>::max(), -0.0, 0.0,
                   std::numeric_limits<double>::infinity(), std::bit_cast<double>(uint64_t{0x7ff8000000abcdefull})}) {
    SCOPED_TRACE("bits " + std::to_string(bits_of(v)));
    request_metrics r;
    r.queue_time = r.ttft = r.tpot = r.e2e = v;
    const request_metrics s = round_trip(sys, r);
    for (double got : {s.queue_time, s.ttft, s.tpot, s.e2e}) EXPECT_EQ(bits_of(got), bits_of(v));
  }
}

}  // namespace
}  // namespace troupe
