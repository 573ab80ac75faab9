#include "kvtransfer/kv_connector.hpp"

#include <optional>
#include <stdexcept>

#include <spdlog/spdlog.h>

#include "kvtransfer/device_kv_copier.hpp"
#include "model/model.hpp"

namespace troupe {

namespace {

// The streamer, with a share of the connector that owns its sender, the model and the device path.
class connector_sink final : public kv_layer_sink {
 public:
  connector_sink(std::shared_ptr<kv_connector> owner, std::unique_ptr<kv_layer_streamer> streamer)
      : owner_(std::move(owner)), streamer_(std::move(streamer)) {}
  void start(int64_t request_id, uint64_t transfer_id) override { streamer_->start(request_id, transfer_id); }
  void forget(int64_t request_id, bool preempted) override { streamer_->forget(request_id, preempted); }
  bool prepare(const step_plan& plan, const std::vector<const std::vector<int32_t>*>& tables) override {
    return streamer_->prepare(plan, tables);
  }
  void on_layer_written(int layer) override { streamer_->on_layer_written(layer); }
  void finish_step() override { streamer_->finish_step(); }

 private:
  std::shared_ptr<kv_connector> owner_;  // declared first: destroyed after the streamer
  std::unique_ptr<kv_layer_streamer> streamer_;
};

}  // namespace

void check_kv_transport(kv_transport transport, const model& m) {
  if (transport == kv_transport::zmq) return;
  const std::string named = "kv_transport \"" + std::string(kv_transport_name(transport)) + "\"";
  if (const std::string why = kv_transport_unavailable(transport); !why.empty()) {
    throw std::runtime_error(named + " cannot run on this node: " + why + "; use \"zmq\"");
  }
  if (!m.kv_pool_on_device()) {
    throw std::runtime_error(named + " copies KV in GPU memory, and backend " + m.backend_name() +
                             " keeps its KV pool in host memory; serve the model on cuda or use \"zmq\"");
  }
}

kv_connector::kv_connector(std::shared_ptr<model> m, kv_connector_settings settings, kv_receiver_events events,
                           kv_sender_events sender_events)
    : model_(std::move(m)), settings_(std::move(settings)), events_(std::move(events)) {
  if (settings_.transport != kv_transport::zmq) {
    // A GPU transport's half on this worker (the node that owns the GPU).
    check_kv_transport(settings_.transport, *model_);
    const std::optional<device_kv_pool> pool = model_->kv_pool_on_device();
    device_ =
        kv_device_path{make_device_kv_copier(settings_.transport, *pool), std::make_shared<kv_device_destinations>()};
    if (settings_.transport == kv_transport::nccl) {
      device_inbox_ = std::make_shared<nccl_kv_inbox>(*pool, make_device_kv_pair_links(settings_.transport, *pool));
      spdlog::info(
          "worker: KV transport nccl: each layer's KV sent and received with NCCL on GPU {} (one "
          "communicator per prefill/decode pair, its id over the cluster's control path), in-place frames "
          "over the KV plane",
          pool->device);
    } else {
      kv_pool_handle_ = device_kv_pool_handle(settings_.transport, *pool);
      spdlog::info(
          "worker: KV transport {}: KV copied device to device from and into the pool on GPU {}, in-place "
          "frames over the KV plane",
          kv_transport_name(settings_.transport), pool->device);
    }
  }
  if (settings_.stage_pairs && !device_) stage_pairs_ = dynamic_cast<kv_stage_pairs*>(model_.get());
  if (stage_pairs_) {
    route_answers_ = std::make_shared<kv_device_destinations>();
    // A transfer that fails here may still have stages writing into its blocks: they stop first.
    events_.failed = [this, failed = std::move(events_.failed)](uint64_t transfer_id, int64_t request_id,
                                                                const std::string& why) {
      release_at_stages(transfer_id);
      if (failed) failed(transfer_id, request_id, why);
    };
    events_.complete = [this, complete = std::move(events_.complete)](uint64_t transfer_id, int64_t request_id) {
      {
        std::lock_guard lock(stage_leased_mutex_);
        stage_leased_.erase(transfer_id);  // every stage's lease completed before its relay came
      }
      if (complete) complete(transfer_id, request_id);
    };
    stage_pairs_->on_stage_lost([this] { fail_stage_leased(); });
    if (!settings_.channel.keys.empty() && !stage_pairs_->stages_keyed()) {
      spdlog::info(
          "worker: the pipeline's stages hold no cluster keys (kvtcp://), so their layers' KV goes through this "
          "engine; started with --credentials (curve://) each stage moves its own");
    }
  }
  // The sender logs each failure itself.
  sender_ = std::make_unique<kv_sender>(settings_.channel, std::move(sender_events));
}

void kv_connector::release_at_stages(uint64_t transfer_id) {
  {
    std::lock_guard lock(stage_leased_mutex_);
    if (stage_leased_.erase(transfer_id) == 0) return;
  }
  stage_pairs_->release_at_stages(transfer_id);
}

kv_connector::~kv_connector() {
  if (stage_pairs_) stage_pairs_->on_stage_lost(nullptr);  // waits for a call in progress
}

void kv_connector::fail_stage_leased() {
  std::vector<uint64_t> leased;
  {
    std::lock_guard lock(stage_leased_mutex_);
    leased.assign(stage_leased_.begin(), stage_leased_.end());
  }
  // A transfer is leased at the stages only after the receiver exists.
  for (const uint64_t transfer_id : leased) {
    receiver_->fail(
        transfer_id,
        "a pipeline stage of this decode instance was lost, and its lease on the transfer's blocks with it");
  }
}

std::unique_ptr<kv_layer_sink> kv_connector::make_layer_sink() {
  return std::make_unique<connector_sink>(
      shared_from_this(), std::make_unique<kv_layer_streamer>(*model_, *sender_, settings_.transfer_timeout, device_,
                                                              kv_stage_pair_path{stage_pairs_, route_answers_}));
}

kv_destination kv_connector::expect(const kv_reservation& r, std::chrono::milliseconds timeout) {
  if (!receiver_) receiver_ = std::make_unique<kv_receiver>(*model_, settings_.channel, events_, device_inbox_);
  kv_expectation expectation;
  expectation.transfer_id = r.transfer_id;
  expectation.request_id = r.request_id;
  expectation.block_ids = r.block_ids;
  expectation.num_tokens = r.num_tokens;
  expectation.deadline = std::chrono::steady_clock::now() + timeout;
  // A device transport writes the blocks itself: its frames only count the layers in.
  expectation.in_place = !kv_pool_handle_.empty() || device_inbox_;
  std::string pool_handle = kv_pool_handle_;
  if (device_inbox_) {
    // nccl: the communicator of the prefill peer the router chose, named in the handle.
    nccl_kv_inbox::handle pair = device_inbox_->handle_for(r.peer);
    pool_handle = std::move(pair.bytes);
    expectation.device_pair = std::move(pair.pair_id);
  }
  const bool in_place = expectation.in_place;
  // The stages can take their own layers when they can also tell this receiver so: with CURVE
  // here, only stages that hold the cluster's keys.
  std::vector<kv_stage_route> routes;
  if (stage_pairs_ && (settings_.channel.keys.empty() || stage_pairs_->stages_keyed())) {
    const kv_stage_lease lease{r.transfer_id, r.request_id,          r.num_tokens,           r.block_ids,
                               timeout,       receiver_->endpoint(), receiver_->public_key()};
    try {
      routes = stage_pairs_->lease_at_stages(lease);
      expectation.relayed = layer_range{routes.front().layers.first, routes.back().layers.end};
    } catch (const std::exception& e) {
      routes.clear();
      spdlog::warn(
          "kv agent: transfer {} of request {}: its stages cannot take their layers' KV themselves ({}); "
          "every layer comes through this engine",
          r.transfer_id, r.request_id, e.what());
    }
  }
  try {
    receiver_->expect(std::move(expectation));
  } catch (...) {
    if (!routes.empty()) stage_pairs_->release_at_stages(r.transfer_id);
    throw;
  }
  if (!routes.empty()) {
    // Only now: a stage lost from here on fails the expectation the receiver holds.
    std::lock_guard lock(stage_leased_mutex_);
    stage_leased_.insert(r.transfer_id);
  }
  kv_destination destination{r.request_id, r.transfer_id,    receiver_->endpoint(), receiver_->public_key(), {},
                             {},           std::move(routes)};
  if (in_place) {
    destination.kv_pool_handle = std::move(pool_handle);
    destination.block_ids = r.block_ids;
  }
  return destination;
}

void kv_connector::cancel(uint64_t transfer_id) {
  if (receiver_) receiver_->cancel(transfer_id);
  if (stage_pairs_) release_at_stages(transfer_id);
}

void kv_connector::send_to(kv_destination d) {
  if (!d.kv_pool_handle.empty() || device_.destinations) {
    if (!device_.destinations || d.kv_pool_handle.empty()) {
      // Every worker of a topology has the same transport; two that differ cannot meet.
      spdlog::warn(
          "kv agent: transfer {} of request {}: the decode side {} a device destination, this worker's KV "
          "transport {} one; its receiver will time out",
          d.transfer_id, d.request_id, d.kv_pool_handle.empty() ? "gave no" : "gave",
          device_.destinations ? "needs" : "takes no");
    } else {
      try {
        device_.destinations->put(d.transfer_id,
                                  kv_device_destination{std::move(d.kv_pool_handle), std::move(d.block_ids)},
                                  std::chrono::steady_clock::now() + settings_.transfer_timeout);
      } catch (const std::exception& e) {
        spdlog::warn("kv agent: request {}: {}; its receiver will time out", d.request_id, e.what());
      }
    }
  }
  if (route_answers_) {
    // The streamer waits for this answer before the transfer's first step computes, routes or not.
    try {
      route_answers_->put(d.transfer_id, kv_device_destination{{}, {}, std::move(d.stage_routes)},
                          std::chrono::steady_clock::now() + settings_.transfer_timeout);
    } catch (const std::exception& e) {
      spdlog::warn("kv agent: request {}: {}; its receiver will time out", d.request_id, e.what());
    }
  } else if (!d.stage_routes.empty()) {
    spdlog::warn(
        "kv agent: transfer {} of request {}: the decode side's stages take their layers' KV themselves, and this "
        "prefill is no pipeline cut alike; its receiver will time out",
        d.transfer_id, d.request_id);
  }
  sender_->ready(d.transfer_id, std::move(d.endpoint), std::move(d.public_key));
}

kv_connector_leases kv_connector::leases() const {
  const kv_receiver_stats in = receiver_ ? receiver_->stats() : kv_receiver_stats{};
  const kv_sender_stats out = sender_->stats();
  return kv_connector_leases{static_cast<int32_t>(in.num_expected), static_cast<int32_t>(out.num_transfers),
                             in.num_refused};
}

}  // namespace troupe
