#pragma once
// A node's topology: which model, on which device, the stages it runs and their limits.
// Read from a TOML file (config/colocated.toml), then overridden by command-line flags.

#include <filesystem>
#include <string>
#include <string_view>

namespace troupe {

struct topology {
  // [model]
  std::string model_path;           // HF directory, .gguf file; relative paths are from the cwd
  std::string load_format = "auto";  // auto | safetensors | gguf | dummy
  // [node]
  std::string node_name = "node0";
  std::string device = "cpu";  // cpu | cuda | auto (cuda when a GPU answers); no GPU: the CPU, logged
  int threads = 0;  // compute threads of the worker; 0: every hardware thread
  float gpu_memory_utilization = 0.9f;  // CUDA: share of the GPU the weights + KV pool may take
  std::string dtype = "bf16";           // CUDA activations and KV pool: f32 | f16 | bf16
  int nano_batches = 1;  // CUDA: prefill/mixed steps spread over this many streams (1 to 4)
  // [frontend]
  std::string zmq_endpoint = "tcp://127.0.0.1:5557";
  std::string api_key;  // empty: no key is asked for
  size_t max_frame_bytes = 4u << 20;
  // [http]: the OpenAI-compatible API (docs/http_api.md), guarded by the same api_key.
  bool http_enabled = false;  // config/colocated.toml turns it on; so does --http-port
  std::string http_host = "127.0.0.1";
  int http_port = 8000;       // 0: any free port (logged)
  size_t http_max_body_bytes = 4u << 20;
  int http_max_connections = 256;  // connections served at once; each open stream holds one
  std::string served_model_name;   // the `model` requests name; empty: the model path as given
  // [tokenizer]
  int tokenizer_pool_size = 2;
  // [scheduler]
  int max_num_batched_tokens = 2048;
  int max_num_seqs = 128;
  int max_waiting_requests = 4096;
  int num_kv_blocks = 0;     // 0: size the pool from kv_memory_mb
  int kv_memory_mb = 512;
  int block_size = 16;
  int max_model_len = 0;     // 0: the model's max_position_embeddings
  // Plan step N+1 while the worker runs step N (docs/architecture.md, "Overlapped scheduling"):
  // on | off | auto (on when the node runs on CUDA; on the CPU the scheduler would take cores
  // from the very forward pass it overlaps). TOML also takes true / false.
  std::string async_scheduling = "auto";

  // Throws std::runtime_error naming the bad setting.
  void validate() const;
};

// `source` names the text in error messages (the file's path).
topology parse_topology(std::string_view toml_text, const std::string& source = "topology");
topology load_topology(const std::filesystem::path& path);

}  // namespace troupe
