#pragma once
// Reads a Hugging Face config.json (and generation_config.json) into a model_config.

#include <filesystem>

#include <nlohmann/json.hpp>

#include "model/model_config.hpp"

namespace troupe {

// `config` is config.json; `generation_config` is generation_config.json or null. Its eos ids
// are merged into the config's (first config.json's, then new ones in order).
// Throws std::runtime_error for an unsupported architecture (naming it and the supported ones),
// an unsupported rope_scaling type, or a missing/invalid field.
model_config parse_hf_config(const nlohmann::json& config, const nlohmann::json& generation_config = nullptr);

// `path` is an HF directory or a config.json; generation_config.json beside it is read when present.
model_config load_hf_config(const std::filesystem::path& path);

// The config.json that describes `config` (the inverse of parse_hf_config, used by the model maker).
nlohmann::json to_hf_config(const model_config& config);

// Reads a whole JSON file; errors name the file.
nlohmann::json read_json_file(const std::filesystem::path& path);

}  // namespace troupe
