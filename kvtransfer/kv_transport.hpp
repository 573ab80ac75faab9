#pragma once
// Which transport carries a request's KV between a prefill and a decode instance
// ([disaggregation] kv_transport). Every transport keeps the ZeroMQ control path (frames,
// leases, deadlines: kv_sender / kv_receiver); the GPU ones move the bytes device to device and
// send in-place frames (kv_frame_header::in_place) so the receiver's lease still sees each layer
// arrive.
//
//   zmq       the bytes in the frames, host to host (every build; CURVE between hosts)
//   cuda_ipc  one host, two processes: the prefill side opens the decode side's pool through
//             cudaIpcOpenMemHandle and copies each layer's blocks into it (cuda_ipc_kv_copier)
//   nccl      between hosts: ncclSend / ncclRecv of each layer's blocks over a communicator per
//             prefill/decode pair (nccl_kv_channel)

#include <string>
#include <string_view>

namespace troupe {

enum class kv_transport { zmq, cuda_ipc, nccl };

// Throws std::invalid_argument naming the value and the choices.
kv_transport parse_kv_transport(std::string_view name);
std::string_view kv_transport_name(kv_transport transport);

// "" when `transport` can run in this process; otherwise why not: a build without CUDA (or
// NCCL), or no GPU answering.
std::string kv_transport_unavailable(kv_transport transport);

}  // namespace troupe
