#pragma once
// The process's receivers by endpoint, so that a sender whose destination lives in the same
// process hands each frame straight to it: no socket, no serialization, one copy into the pool.
// Internal to kvtransfer (kv_receiver registers itself, kv_sender looks up).

#include <cstddef>
#include <span>
#include <string>

namespace troupe {

// What a receiver does with one frame, whichever way it came: the same checks for both paths.
class kv_frame_sink {
 public:
  virtual ~kv_frame_sink() = default;
  virtual void take_frame(std::span<const std::byte> header, std::span<const std::byte> payload) = 0;
};

void register_local_receiver(const std::string& endpoint, kv_frame_sink& sink);
// Removes the receiver and waits until no sender is inside its take_frame any more: after this
// returns, no frame reaches it (its destructor may then free what take_frame uses).
void unregister_local_receiver(const std::string& endpoint);
// Hands the frame to the receiver at `endpoint` on the calling thread; false when no receiver of
// this process has that endpoint.
bool deliver_to_local_receiver(const std::string& endpoint, std::span<const std::byte> header,
                               std::span<const std::byte> payload);

}  // namespace troupe
