#pragma once
// The kv_pool_handle bytes of kv_transport "nccl" (kv_ready_msg, over the cluster's
// authenticated control path): the pair's id, which the decode side made for the prefill peer
// the transfer comes from, and the decode side's pool geometry, which the prefill side checks
// against its own before it posts a send (NCCL moves bytes and pairs sizes; it cannot tell a
// pool of another shape). The two sides may be different hosts: the fields are little-endian.

#include <string>

#include "model/model.hpp"

namespace troupe {

struct nccl_pool_handle {
  std::string pair_id;      // kv_pair_links::make_id bytes (an ncclUniqueId on a GPU)
  device_kv_pool geometry;  // base null and device 0: the pool is in another process
};

// The most bytes a pair id may have (an ncclUniqueId has 128).
inline constexpr size_t max_nccl_pair_id_bytes = 256;

// Throws std::invalid_argument for an empty id or one above max_nccl_pair_id_bytes.
std::string encode_nccl_pool_handle(const std::string& pair_id, const device_kv_pool& pool);
// Throws std::invalid_argument naming the field for bytes that are not a handle of this version.
nccl_pool_handle decode_nccl_pool_handle(const std::string& bytes);

}  // namespace troupe
