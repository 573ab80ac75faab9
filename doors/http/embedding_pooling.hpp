#pragma once
// How /v1/embeddings pools a prompt's hidden states, as the served model says: a
// sentence-transformers model lists its modules (modules.json) and its Pooling module's
// config.json names the mode (pooling_mode_mean_tokens, pooling_mode_lasttoken), a Normalize
// module normalizes. Without them: the last token, normalized (vLLM's default for decoder-only
// models).

#include <filesystem>
#include <string>

#include "protocol/sampling_params.hpp"

namespace troupe {

struct pooling_settings {
  pooling_kind pooling = pooling_kind::last;
  bool normalize = true;
  std::string source;  // where it came from, for the log
};

// Throws std::runtime_error naming the file when the model's pooling config asks for a mode not
// served (CLS, max, weighted mean).
pooling_settings read_pooling_settings(const std::filesystem::path& model_path);

}  // namespace troupe
