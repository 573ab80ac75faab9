#pragma once
// A node that serves clients: one process, one CAF actor system, the doors and the router, and
// the controller of every other stage the topology places: on itself when colocated (every
// stage), on `troupe node` processes otherwise (node/remote_node.hpp), reached over mutual TLS.

#include <memory>
#include <string>

#include "node/topology.hpp"

namespace troupe {

class node {
 public:
  // Loads the model, spawns the stages and binds the frontend; throws std::runtime_error naming
  // what failed.
  explicit node(const topology& t);
  ~node();  // stops the frontend, then the actors
  node(const node&) = delete;
  node& operator=(const node&) = delete;

  // A failure drill: makes the named stage ("tokenizer", "scheduler", "worker" or
  // "detokenizer") throw `reason` from a message handler, as a bug would. The node then does
  // what it does for any failed stage: logs it, ends every request in flight with an `internal`
  // error naming the stage, and refuses new requests (restart the process to serve again).
  // Throws std::invalid_argument for an unknown stage name.
  void fail_stage(const std::string& stage, const std::string& reason);

  // True once a stage has failed and the node refuses new requests (they get an `internal`
  // error naming the stage); it stays so until the process restarts.
  bool out_of_service() const;

  // The ZeroMQ endpoint the door bound (the port chosen, for `tcp://HOST:*`).
  std::string zmq_endpoint() const;

  // A graceful drain's steps (serve_until_signal runs them as node/drain_plan.hpp says).
  // Both doors refuse every new request with `reason` from now on; running ones go on.
  void close_admission(const std::string& reason);
  // Requests the doors hold: admitted and not yet answered whole (a stream to its `[DONE]`).
  size_t num_running() const;
  // Ends every request still in the stages with an `unavailable` error naming `reason`, which
  // each client gets (an SSE error event and `[DONE]`, an error JSON, a ZeroMQ error reply).
  void end_running(const std::string& reason);
  // Asks the engine instances for their gauges; the throughput line (doors/throughput_log.hpp)
  // is logged when they answer, if something happened since the last one.
  void log_throughput();

 private:
  topology topology_;  // the placer and the doors read it for the node's whole life
  struct impl;
  std::unique_ptr<impl> impl_;
};

// Serves until SIGINT or SIGTERM, then drains: new requests refused, running ones given up to
// the topology's drain_timeout_s, the rest ended with an error; a second signal ends the drain
// at once. Logs the throughput line every log_stats_interval_s meanwhile.
void serve_until_signal(const topology& t);

}  // namespace troupe
