#pragma once
// The KV plane of one engine instance, as its worker and KV agent see it: one plain class that
// owns the transport (in-process, plain TCP, ZeroMQ with CURVE; CUDA IPC or NCCL for the bytes
// themselves), the sender, and the receiver with its leases. The engine sees only the layer sink
// it makes (kv_layer_sink); the KV agent actor only turns messages into these calls.
//
//   decode side   expect(reservation)  -> where the prefill side must send (endpoint, key, and
//                                         for a device transport the pool and blocks)
//                 cancel(transfer)        the reservation is given up
//   prefill side  make_layer_sink()    -> what the runner streams each computed layer into
//                 send_to(destination)    the decode side's answer, from the router
//
// A pipelined model (kvtransfer/kv_stage_pairs.hpp) leases the blocks at its remote stages too
// when it expects, and releases them with the transfer; as a prefill its stages push their
// layers to the decode stages the answer names.
//
// The receiver is made at the first expectation, never before: a topology that does not
// disaggregate opens no KV listener (issue 25).

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "engine/kv_handoff.hpp"
#include "engine/kv_layer_sink.hpp"
#include "kvtransfer/kv_channel.hpp"
#include "kvtransfer/kv_device_destinations.hpp"
#include "kvtransfer/kv_layer_streamer.hpp"
#include "kvtransfer/kv_receiver.hpp"
#include "kvtransfer/kv_sender.hpp"
#include "kvtransfer/kv_stage_pairs.hpp"
#include "kvtransfer/kv_transport.hpp"
#include "kvtransfer/nccl_kv_inbox.hpp"

namespace troupe {

class model;

struct kv_connector_settings {
  kv_channel_settings channel;
  std::chrono::milliseconds transfer_timeout{10000};
  kv_transport transport = kv_transport::zmq;  // a GPU one is refused by name where it cannot run
  // A pipelined model's remote stages move their layers' KV themselves, a channel per pair of
  // stages (kvtransfer/kv_stage_pairs.hpp), when the peer is a pipeline cut alike ([pipeline]
  // kv_stage_pairs). Off, or on a device transport: every layer goes through the engines.
  bool stage_pairs = false;
};

// Where a transfer's frames go, as the decode side answers a reservation.
struct kv_destination {
  int64_t request_id = 0;
  uint64_t transfer_id = 0;
  std::string endpoint;
  std::string public_key;
  // A device transport's destination: the decode pool (cuda_ipc's handle, or nccl's pair and
  // geometry) and the blocks reserved; both empty on the host transports.
  std::string kv_pool_handle;
  std::vector<int32_t> block_ids;
  // A pipelined decode instance's stages that receive their layers' KV themselves, in order
  // (kvtransfer/kv_stage_pairs.hpp); empty: every layer comes to `endpoint`.
  std::vector<kv_stage_route> stage_routes;
};

struct kv_connector_leases {
  int32_t num_expected = 0;  // receiver: transfers whose blocks are reserved here
  int32_t num_sending = 0;   // sender: transfers with frames held or queued
  uint64_t num_refused_frames = 0;
};

// Where a worker starts (the node that owns its GPU): throws std::runtime_error naming why
// `transport` cannot carry KV for `m` here (a build without CUDA, no GPU answering, a pool in host
// memory). zmq always can.
void check_kv_transport(kv_transport transport, const model& m);

class kv_connector : public std::enable_shared_from_this<kv_connector> {
 public:
  // The connector keeps `m` alive (the receiver imports into its pool). The receiver's
  // completions and failures come through `events`, on its thread; the sender's failures (a
  // transfer this prefill side gave up: its deadline passed, the peer refused it) through
  // `sender_events`, on the sender's thread (the sender logs them). Throws (check_kv_transport)
  // for a transport that cannot run here.
  kv_connector(std::shared_ptr<model> m, kv_connector_settings settings, kv_receiver_events events,
               kv_sender_events sender_events = {});
  ~kv_connector();
  kv_connector(const kv_connector&) = delete;
  kv_connector& operator=(const kv_connector&) = delete;

  // The runner's KV sink: each layer a step writes goes to the sender (or a device copy) at once.
  // The sink holds a share of the connector (which must be owned by a std::shared_ptr), so the
  // sender it writes into lives as long as the runner does.
  std::unique_ptr<kv_layer_sink> make_layer_sink();

  // A reservation of this (decode) instance's blocks: its lease, and where to send. Throws
  // naming why (a bad reservation, a receiver that cannot listen).
  kv_destination expect(const kv_reservation& reservation, std::chrono::milliseconds timeout);
  void cancel(uint64_t transfer_id);
  // Where a transfer this (prefill) instance computes must go. A device destination the transport
  // cannot use is logged and left to time out on the receiver's side; never throws.
  void send_to(kv_destination destination);

  kv_connector_leases leases() const;

 private:
  std::shared_ptr<model> model_;
  kv_connector_settings settings_;
  kv_receiver_events events_;
  kv_device_path device_;
  std::string kv_pool_handle_;                   // cuda_ipc: this pool's handle, in every answer
  std::shared_ptr<nccl_kv_inbox> device_inbox_;  // nccl: the decode side's pairs
  // Release the stages' leases of a transfer that ended other than complete.
  void release_at_stages(uint64_t transfer_id);
  // Fails every transfer leased at the stages (one of them was lost, and its leases with it).
  void fail_stage_leased();
  kv_stage_pairs* stage_pairs_ = nullptr;                  // the model's, when it is a pipeline and pairs are on
  std::shared_ptr<kv_device_destinations> route_answers_;  // prefill: the decode side's routes, for the streamer
  std::mutex stage_leased_mutex_;
  std::set<uint64_t> stage_leased_;  // decode: transfers with leases at the stages
  // Declared last: destroyed first, while the model they read and write is still there.
  std::unique_ptr<kv_sender> sender_;
  std::unique_ptr<kv_receiver> receiver_;
};

}  // namespace troupe
