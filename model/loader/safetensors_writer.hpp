#pragma once
// Writes .safetensors files (one, or shards with model.safetensors.index.json): the model
// maker's output and the tests' fixtures.

#include <cstdint>
#include <filesystem>
#include <vector>

#include "model/loader/safetensors_file.hpp"
#include "model/weight_store.hpp"

namespace troupe {

// Writes `tensors` (their data is copied from `data`, `num_bytes` each) in the given order.
// Weights must be plain (no row scales or column order: those have no safetensors form).
void write_safetensors(const std::filesystem::path& path, const std::vector<weight_tensor>& tensors);
// The same for tensors of any safetensors dtype Troupe reads (quantized checkpoints' I32 packs).
void write_safetensors(const std::filesystem::path& path, const std::vector<safetensors_tensor>& tensors);

// Splits `tensors` into shards of at most `max_shard_bytes` (a bigger tensor gets a shard of its
// own), named model-0000i-of-0000n.safetensors, plus model.safetensors.index.json.
// Returns the number of shards.
int write_sharded_safetensors(const std::filesystem::path& directory, const std::vector<weight_tensor>& tensors,
                              uint64_t max_shard_bytes);

}  // namespace troupe
