#pragma once
// The copies a device transport (CUDA IPC, NCCL) makes for one span of a request's KV: per layer
// and side, runs of blocks that are consecutive in both pools, so blocks a scheduler handed out
// in order move in one copy instead of one per block. Plain arithmetic on offsets, checked
// before any device memory is touched (the destination's geometry comes from the other process).

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "model/model.hpp"

namespace troupe {

struct device_kv_run {
  size_t src_offset = 0;  // bytes from the source pool's base
  size_t dst_offset = 0;  // bytes from the destination pool's base
  size_t bytes = 0;
};

// Byte offset of block `block` of side `side` (0: K, 1: V) of layer `layer` in `pool`.
size_t device_kv_offset(const device_kv_pool& pool, int layer, int side, int32_t block);

// The runs that copy layers [first_layer, first_layer + num_layers) of src_blocks[i] into
// dst_blocks[i], for every i. Throws std::invalid_argument naming what is wrong: block sizes or
// element types that differ (a device transport copies bytes, it does not convert), a layer range
// outside either pool, block lists of different lengths, an id outside its pool, a destination id
// that repeats.
std::vector<device_kv_run> device_kv_runs(const device_kv_pool& src, std::span<const int32_t> src_blocks,
                                          const device_kv_pool& dst, std::span<const int32_t> dst_blocks,
                                          int first_layer, int num_layers);

}  // namespace troupe
