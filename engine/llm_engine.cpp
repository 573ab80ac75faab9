#include "engine/llm_engine.hpp"

#include <chrono>
#include <stdexcept>

#include "grammar/guided_grammar.hpp"
#include "model/architecture.hpp"
#include <string>

namespace troupe {

engine_config llm_engine::fit_to_model(engine_config config, const model& m) {
  const kv_cache_shape shape = m.kv_shape();
  if (config.block_size != shape.block_size) {
    throw std::runtime_error("llm_engine: engine block_size " + std::to_string(config.block_size) +
                             " differs from the model's KV block size " + std::to_string(shape.block_size));
  }
  if (config.num_kv_blocks == 0) config.num_kv_blocks = shape.num_blocks;
  if (config.num_kv_blocks > shape.num_blocks) {
    throw std::runtime_error("llm_engine: num_kv_blocks " + std::to_string(config.num_kv_blocks) +
                             " exceeds the model's pool of " + std::to_string(shape.num_blocks));
  }
  const int model_len = m.config().max_position_embeddings;
  if (model_len > 0 && config.max_model_len > model_len) config.max_model_len = model_len;
  if (config.kv_window < 0) config.kv_window = attention_reach(m.config());
  if (config.kv_window > 0 && config.kv_window < attention_reach(m.config())) {
    throw std::runtime_error("llm_engine: kv_window " + std::to_string(config.kv_window) +
                             " is narrower than the model's window of " + std::to_string(attention_reach(m.config())) +
                             " tokens");
  }
  if (config.kv_window > 0 && attention_reach(m.config()) == 0) {
    throw std::runtime_error("llm_engine: kv_window " + std::to_string(config.kv_window) +
                             " releases blocks, but some layer of the model attends to the whole context");
  }
  config.validate();
  return config;
}

llm_engine::llm_engine(std::unique_ptr<model> m, engine_config config,
                       std::optional<std::vector<int32_t>> eos_token_ids, uint64_t sampler_seed)
    : model_(m ? std::move(m) : throw std::runtime_error("llm_engine: no model given")),
      scheduler_(fit_to_model(std::move(config), *model_),
                 eos_token_ids ? std::move(*eos_token_ids)
                               : std::vector<int32_t>(model_->config().eos_token_ids.begin(),
                                                      model_->config().eos_token_ids.end())),
      runner_(*model_, sampler_seed) {}

add_request_result llm_engine::add_request(std::vector<int32_t> prompt_ids, sampling_params params, int priority,
                                           std::span<const int32_t> resumed_output_ids) {
  const int vocab = model_->config().vocab_size;
  for (int32_t t : prompt_ids) {
    if (t < 0 || t >= vocab) {
      return {-1, request_error{error_code::bad_request, "prompt token id " + std::to_string(t) +
                                                             " is outside the vocabulary of " + std::to_string(vocab)}};
    }
  }
  for (int32_t t : resumed_output_ids) {
    if (t < 0 || t >= vocab) {
      return {-1, request_error{error_code::bad_request, "resumed output token id " + std::to_string(t) +
                                                             " is outside the vocabulary of " + std::to_string(vocab)}};
    }
  }
  if (is_guided(params)) {
    if (!runner_.has_vocabulary()) {
      return {-1, request_error{error_code::bad_request,
                                "structured output needs the tokenizer's vocabulary (llm_engine::set_vocabulary)"}};
    }
    if (auto problem = check_guided_decoding(params)) {
      return {-1, request_error{error_code::bad_request, problem->field + " " + problem->problem}};
    }
  }
  const int64_t id = next_request_id_;
  if (auto error = scheduler_.add_request(id, std::move(prompt_ids), std::move(params), priority, engine_clock::now(),
                                          resumed_output_ids)) {
    return {-1, std::move(error)};
  }
  ++next_request_id_;
  return {id, std::nullopt};
}

bool llm_engine::abort(int64_t request_id) {
  std::optional<token_delta> last = scheduler_.abort(request_id);
  if (!last) return false;
  pending_.push_back(std::move(*last));
  return true;
}

bool llm_engine::stop(int64_t request_id) {
  std::optional<token_delta> last = scheduler_.stop(request_id);
  if (!last) return false;
  pending_.push_back(std::move(*last));
  return true;
}

std::vector<request_output> llm_engine::step() {
  std::vector<request_output> outputs = std::move(pending_);
  pending_.clear();
  step_plan plan = scheduler_.schedule();
  if (plan.empty()) return outputs;
  const auto started = engine_clock::now();
  step_result result = runner_.run(plan);
  // The step-time model learns from this engine's own steps too (`troupe plan --calibrate`).
  scheduler_.observe_step(outline_of(plan), std::chrono::duration<double>(engine_clock::now() - started).count());
  // A request the runner failed alone (a logits plugin) ends aborted; its token is dropped.
  for (const failed_request& f : result.failed) {
    if (std::optional<token_delta> last = scheduler_.abort(f.request_id)) outputs.push_back(std::move(*last));
  }
  std::vector<token_delta> deltas = scheduler_.update(plan, result);
  outputs.insert(outputs.end(), std::make_move_iterator(deltas.begin()), std::make_move_iterator(deltas.end()));
  return outputs;
}

}  // namespace troupe
