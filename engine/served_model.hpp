#pragma once
// The one setup of a model for `troupe generate` and for a serving node: weights, the backend
// model with its KV pool, the tokenizer, the EOS ids and the limits the engine derives from them.
// `model_spec` is plain data so that it can travel to the node that loads the model.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backends/backend_selection.hpp"
#include "engine/engine_config.hpp"
#include "model/loader/model_loader.hpp"
#include "model/model.hpp"
#include "text/tokenizer.hpp"

namespace troupe {

struct model_spec {
  std::string path;  // HF directory, .gguf file, or (dummy weights) a config.json
  load_format format = load_format::auto_detect;
  device_request device = device_request::cpu;
  backend_options backend;
  int block_size = 16;
  int num_kv_blocks = 0;   // 0: size the pool from memory (kv_memory_mb on the CPU)
  int kv_memory_mb = 512;  // CPU KV budget when num_kv_blocks is 0
  int max_model_len = 0;   // 0: the model's max_position_embeddings (at most max_served_model_len)
  int max_num_seqs = 128;  // a pool sized from memory never holds more than these at full length
  // The memory this process may take for the model (its pipeline stage's weights) and its KV
  // pool (kv_memory_mb), in MiB; 0: no bound. A model that does not fit is refused before its
  // weights are read, naming the bytes it needs (`--memory-budget-mb`, [node] memory_budget_mb).
  int memory_budget_mb = 0;

  // Throws std::runtime_error naming the first bad field; validate_settings leaves out the path.
  void validate() const;
  void validate_settings() const;
};

struct served_model {
  loaded_model loaded;  // must outlive `backend_model`, which views its weights
  std::unique_ptr<troupe::model> backend_model;
  std::string device_note;  // why the device differs from the request; empty if not
  std::unique_ptr<tokenizer> tok;
  int max_model_len = 0;
  // The model's EOS ids (config.json / generation_config / GGUF) and the tokenizer's (a chat
  // model's turn end, e.g. <|eot_id|>), in that order, each once.
  std::vector<int32_t> eos_token_ids;

  // block_size, num_kv_blocks and max_model_len from the model; the caller sets the budgets.
  engine_config base_engine_config() const;
};

// The tokenizer that belongs to a model path (for dummy weights given as a config.json, the one
// in its directory). Throws naming the path and what is missing.
std::unique_ptr<tokenizer> load_model_tokenizer(const std::string& model_path);

// Loads everything `spec` names. A tokenizer already loaded (to count a prompt first) may be
// passed in. Throws std::runtime_error naming the path or setting that is wrong.
std::shared_ptr<served_model> load_served_model(const model_spec& spec, std::unique_ptr<tokenizer> tok = nullptr);

// One line for the log: the model, its backend, its KV pool and context.
std::string describe(const served_model& served);

}  // namespace troupe
