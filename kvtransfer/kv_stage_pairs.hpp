#pragma once
// A KV channel per pair of pipeline stages (issue 27): when a prefill instance and a decode
// instance are both pipelines cut at the same layers, stage k of the prefill sends its layers' KV
// straight to stage k of the decode, so a request's KV spreads over the stages' links instead of
// crossing the two engines. Only the layers the engines hold themselves go engine to engine.
//
//   decode engine   expect(): leases the reserved blocks at each remote stage for its layers
//                   (lease_at_stages); each stage answers with its KV receiver, and the engine's
//                   own lease takes the stages' layers as relayed (kv_expectation::relayed)
//   prefill engine  each remote stage, once the step has left it, pushes its layers of every
//                   streaming request to the decode stage the routes name (push_from_stage)
//   decode stage    its receiver imports them under its lease; once all its layers are in, it
//                   says so with one in-place frame to the decode engine's receiver
//
// Every lease stays a lease: the decode stage refuses frames for transfers it was not told to
// expect, and a released one gets nothing more written into its blocks.
//
// A model whose layers are partly held by remote stages (pipeline/pipelined_model.hpp)
// implements this; the KV connector (kvtransfer/kv_connector.hpp) finds it by dynamic_cast.

#include <chrono>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "model/kv_transfer.hpp"
#include "model/layer_range.hpp"

namespace troupe {

// Where the KV of one decode stage's layers goes: its KV receiver.
struct kv_stage_route {
  layer_range layers;
  std::string endpoint;    // tcp:// (CURVE) or kvtcp:// (plain, loopback)
  std::string public_key;  // "" without CURVE
};

// A route as text, "FIRST-LAST\nENDPOINT\nKEY" (the layers inclusive, the key empty without
// CURVE), as stage frames and kv_ready messages carry it: at most kv_stage_route_max_bytes, and at
// most kv_stage_routes_max routes in one answer.
inline constexpr size_t kv_stage_route_max_bytes = 1024;
inline constexpr size_t kv_stage_routes_max = 64;
std::string kv_stage_route_text(const kv_stage_route& route);
// Throws std::invalid_argument naming what is wrong: too long, not three lines, layers that are
// not a range, an endpoint or key with bytes that are not printable ASCII.
kv_stage_route parse_kv_stage_route(std::string_view text);

// A decode stage's lease on the blocks reserved for one transfer.
struct kv_stage_lease {
  uint64_t transfer_id = 0;
  int64_t request_id = 0;
  int32_t num_tokens = 0;
  std::vector<int32_t> block_ids;  // the decode pool's blocks for tokens [0, num_tokens)
  std::chrono::milliseconds timeout{10000};
  // The decode engine's KV receiver, which the stage tells once its layers are in.
  std::string relay_endpoint;
  std::string relay_public_key;
};

// One push of a prefill stage's layers of one request to its decode peer.
struct kv_stage_push {
  uint64_t transfer_id = 0;
  int64_t request_id = 0;
  int32_t token_begin = 0;  // block-aligned, as a KV frame's (kvtransfer/kv_frame.hpp)
  int32_t token_end = 0;
  kv_span_header span;             // the stage's layers over the blocks below
  std::vector<int32_t> block_ids;  // the prefill pool's blocks of [token_begin, token_end)
  bool last = false;               // the request's last chunk: the stage's transfer then closes
  std::chrono::milliseconds timeout{10000};
  kv_stage_route to;
};

class kv_stage_pairs {
 public:
  virtual ~kv_stage_pairs() = default;
  // The layers each remote stage holds, in order (the engine holds the rest).
  virtual std::vector<layer_range> remote_stage_layers() const = 0;
  // Whether every remote stage holds the cluster's CURVE keys (its link is curve://): a decode
  // stage must reach its engine's receiver, which wants CURVE when the engine has keys, and a
  // prefill stage must reach a decode stage that wants CURVE.
  virtual bool stages_keyed() const = 0;
  // Decode side: leases `lease`'s blocks at every remote stage; each stage's route, in order.
  // Throws std::runtime_error naming the stage that could not (the leases made are released).
  virtual std::vector<kv_stage_route> lease_at_stages(const kv_stage_lease& lease) = 0;
  // Decode side: ends the transfer's leases at the stages; returns once no stage writes into its
  // blocks any more (a stage that is down holds nothing). Never throws.
  virtual void release_at_stages(uint64_t transfer_id) = 0;
  // Decode side: `listener` is called (on a thread of the model's, with no lock of it held) each
  // time a remote stage is noticed lost: the leases it held went with it, so the transfers that
  // wait for its relay can fail at once instead of at their deadline. nullptr: no listener
  // (returns once a call in progress is over).
  virtual void on_stage_lost(std::function<void()> listener) = 0;
  // Prefill side, inside a forward (after_layer_kv): remote stage `stage` sends its share of a
  // request's KV to `push.to`. Queued on the stage's link without waiting: the forward waits for
  // its pushes before it returns, and fails as one whose stage was lost when the stage went away
  // meanwhile; a push the stage refuses is logged (the decode's lease then times out, and the
  // request runs again). Throws std::runtime_error for a stage that does not exist.
  virtual void push_from_stage(size_t stage, const kv_stage_push& push) = 0;
};

}  // namespace troupe
