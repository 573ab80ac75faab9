#include "kvtransfer/nccl_kv_channel.hpp"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <stdexcept>
#include <thread>

#include "kvtransfer/device_kv_runs.hpp"

namespace troupe {

namespace {

// How often a wait looks at NCCL's and CUDA's state: short against a layer's copy, long enough
// not to take a core from the forward on the same host.
constexpr auto poll_interval = std::chrono::microseconds(50);

void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    cudaGetLastError();
    throw std::runtime_error(std::string("nccl kv channel: ") + what + ": " + cudaGetErrorString(status));
  }
}

}  // namespace

std::string make_nccl_unique_id() {
  ncclUniqueId id;
  if (const ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) {
    throw std::runtime_error(std::string("nccl kv channel: ncclGetUniqueId: ") + ncclGetErrorString(r));
  }
  return std::string(id.internal, sizeof id.internal);
}

nccl_kv_channel::nccl_kv_channel(device_kv_pool pool, const std::string& unique_id, side s,
                                 std::chrono::steady_clock::time_point deadline, const kv_link_stop& stop)
    : pool_(pool), side_(s) {
  ncclUniqueId id;
  if (unique_id.size() != sizeof id.internal) {
    throw std::invalid_argument("nccl kv channel: a unique id of " + std::to_string(unique_id.size()) +
                                " bytes, expected " + std::to_string(sizeof id.internal));
  }
  std::memcpy(id.internal, unique_id.data(), sizeof id.internal);
  check_cuda(cudaSetDevice(pool_.device), "cudaSetDevice");
  cudaStream_t stream = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  stream_ = stream;
  cudaEvent_t done = nullptr;
  check_cuda(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "cudaEventCreate");
  done_ = done;
  // Non-blocking: init and group calls return at once, and every wait below is ours to bound.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  const ncclResult_t r = ncclCommInitRankConfig(&comm, 2, id, side_ == side::prefill ? 0 : 1, &config);
  comm_ = comm;
  try {
    if (r != ncclSuccess && r != ncclInProgress) {
      throw std::runtime_error(std::string("nccl kv channel: ncclCommInitRankConfig: ") + ncclGetErrorString(r));
    }
    wait_for_comm(deadline, stop, "joining the pair's communicator (the peer did not join in time?)");
  } catch (...) {
    if (comm_) ncclCommAbort(static_cast<ncclComm_t>(comm_));
    comm_ = nullptr;
    cudaEventDestroy(done);
    cudaStreamDestroy(stream);
    throw;
  }
}

nccl_kv_channel::~nccl_kv_channel() {
  cudaSetDevice(pool_.device);
  if (comm_) {
    // A broken channel was aborted already; a healthy one has nothing in flight (transfer waits).
    ncclCommAbort(static_cast<ncclComm_t>(comm_));
  }
  if (done_) cudaEventDestroy(static_cast<cudaEvent_t>(done_));
  if (stream_) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
}

void nccl_kv_channel::wait_for_comm(std::chrono::steady_clock::time_point deadline, const kv_link_stop& stop,
                                    const char* what) {
  auto comm = static_cast<ncclComm_t>(comm_);
  for (;;) {
    ncclResult_t state = ncclSuccess;
    if (const ncclResult_t r = ncclCommGetAsyncError(comm, &state); r != ncclSuccess) state = r;
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) abort(std::string(what) + ": " + ncclGetErrorString(state));
    if (std::chrono::steady_clock::now() >= deadline) abort(std::string(what) + ": the deadline passed");
    if (stop && stop()) abort(std::string(what) + ": stopped (the transfer ended)");
    std::this_thread::sleep_for(poll_interval);
  }
}

void nccl_kv_channel::abort(const std::string& why) {
  if (comm_) ncclCommAbort(static_cast<ncclComm_t>(comm_));
  comm_ = nullptr;
  broken_ = true;
  throw std::runtime_error("nccl kv channel: " + why);
}

void nccl_kv_channel::transfer(std::span<const int32_t> blocks, int first_layer, int num_layers,
                               std::chrono::steady_clock::time_point deadline) {
  post(blocks, first_layer, num_layers, deadline, {});
  wait(deadline, {});
}

void nccl_kv_channel::post(std::span<const int32_t> blocks, int first_layer, int num_layers,
                           std::chrono::steady_clock::time_point deadline, const kv_link_stop& stop) {
  if (broken_) throw std::runtime_error("nccl kv channel: broken by an earlier failure; make a new one");
  // The pool against itself: ids, layers, and (receiving) no id twice, before anything is posted.
  device_kv_runs(pool_, blocks, pool_, blocks, first_layer, num_layers);
  check_cuda(cudaSetDevice(pool_.device), "cudaSetDevice");
  auto comm = static_cast<ncclComm_t>(comm_);
  auto stream = static_cast<cudaStream_t>(stream_);
  auto* base = static_cast<char*>(pool_.base);
  const int peer = side_ == side::prefill ? 1 : 0;
  ncclResult_t r = ncclGroupStart();
  for (int layer = first_layer; r == ncclSuccess && layer < first_layer + num_layers; ++layer) {
    for (int kv = 0; r == ncclSuccess && kv < 2; ++kv) {
      for (const int32_t block : blocks) {
        char* at = base + device_kv_offset(pool_, layer, kv, block);
        r = side_ == side::prefill ? ncclSend(at, pool_.block_bytes, ncclInt8, peer, comm, stream)
                                   : ncclRecv(at, pool_.block_bytes, ncclInt8, peer, comm, stream);
        if (r != ncclSuccess && r != ncclInProgress) break;
        r = ncclSuccess;
      }
    }
  }
  const ncclResult_t end = ncclGroupEnd();
  if (r != ncclSuccess)
    abort(std::string(side_ == side::prefill ? "ncclSend: " : "ncclRecv: ") + ncclGetErrorString(r));
  if (end != ncclSuccess && end != ncclInProgress) abort(std::string("ncclGroupEnd: ") + ncclGetErrorString(end));
  wait_for_comm(deadline, stop, "posting the layer's blocks");
}

void nccl_kv_channel::wait(std::chrono::steady_clock::time_point deadline, const kv_link_stop& stop) {
  if (broken_) throw std::runtime_error("nccl kv channel: broken by an earlier failure; make a new one");
  check_cuda(cudaSetDevice(pool_.device), "cudaSetDevice");
  auto comm = static_cast<ncclComm_t>(comm_);
  auto stream = static_cast<cudaStream_t>(stream_);
  // After everything posted on the stream so far.
  check_cuda(cudaEventRecord(static_cast<cudaEvent_t>(done_), stream), "cudaEventRecord");
  for (;;) {
    const cudaError_t status = cudaEventQuery(static_cast<cudaEvent_t>(done_));
    if (status == cudaSuccess) return;
    if (status != cudaErrorNotReady) {
      cudaGetLastError();
      abort(std::string("the copies failed: ") + cudaGetErrorString(status));
    }
    ncclResult_t state = ncclSuccess;
    ncclCommGetAsyncError(comm, &state);
    if (state != ncclSuccess && state != ncclInProgress)
      abort(std::string("the copies failed: ") + ncclGetErrorString(state));
    if (std::chrono::steady_clock::now() >= deadline) {
      abort("the deadline passed before the peer " + std::string(side_ == side::prefill ? "received" : "sent") +
            " every block");
    }
    if (stop && stop())
      abort("stopped before the peer " + std::string(side_ == side::prefill ? "received" : "sent") +
            " every block (the transfer ended)");
    std::this_thread::sleep_for(poll_interval);
  }
}

namespace {

class nccl_pair_links final : public kv_pair_links {
 public:
  explicit nccl_pair_links(device_kv_pool pool) : pool_(pool) {}
  std::string make_id() override { return make_nccl_unique_id(); }
  std::unique_ptr<kv_pair_link> join(const std::string& id, kv_pair_side side,
                                     std::chrono::steady_clock::time_point deadline,
                                     const kv_link_stop& stop) override {
    return std::make_unique<nccl_kv_channel>(pool_, id, side, deadline, stop);
  }

 private:
  device_kv_pool pool_;
};

}  // namespace

std::shared_ptr<kv_pair_links> make_nccl_pair_links(device_kv_pool pool) {
  return std::make_shared<nccl_pair_links>(pool);
}

}  // namespace troupe
