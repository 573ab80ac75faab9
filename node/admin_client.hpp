#pragma once
// `troupe scale`'s side of a controller's admin door (node/admin_door.hpp): a member of the
// cluster connects over mutual TLS with its own certificate from `troupe certs` and asks the
// controller to add an engine instance on a node, drain one, or list them.
//
// Every wait is finite: the connection (TLS and CAF's handshake) within connect_timeout, each
// answer within the timeout its call is given. Every failure throws std::runtime_error naming
// what failed: the credentials file, the controller's address, the node or the instance id.

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "stages/engine_router.hpp"

namespace troupe {

struct admin_client_options {
  std::string host;  // the controller's [cluster] admin_listen
  uint16_t port = 0;
  std::filesystem::path credentials_dir;             // from `troupe certs`: ca.crt, NAME.crt, NAME.key
  std::string name;                                  // this member's name in the credentials
  std::chrono::milliseconds connect_timeout{10000};  // as [cluster] connect_timeout_ms
};

// "HOST:PORT" (PORT 1 to 65535) into options' host and port; throws std::invalid_argument naming
// the text and what is wrong.
void parse_controller_address(const std::string& text, admin_client_options& options);

class admin_client {
 public:
  // Checks the credentials first (a clear error before any connection), then connects.
  explicit admin_client(const admin_client_options& options);
  ~admin_client();
  admin_client(const admin_client&) = delete;
  admin_client& operator=(const admin_client&) = delete;

  // Places an instance on `node` and waits until it serves (its node loads the model, so allow
  // for that in `timeout`); returns the controller's answer, "engine instance N on NODE".
  // `role`: "mixed" (the default), "prefill" or "decode".
  std::string add_engine(const std::string& node, std::chrono::milliseconds timeout, const std::string& role = "mixed");
  // Stops new requests to instance `id`; it stops once its last request ends. Throws for an id
  // the controller does not have.
  void drain_engine(engine_instance_id id, std::chrono::milliseconds timeout);
  // Drains every engine instance on `node`; their ids. `deadline`: how long their requests may
  // run on there (zero: to their end); after it the ones left re-run elsewhere. Throws when the
  // node has no active instance.
  std::vector<engine_instance_id> drain_node(const std::string& node, std::chrono::milliseconds deadline,
                                             std::chrono::milliseconds timeout);
  // One line per instance: "ID NODE active|draining requests=.. queued_prompt_tokens=.. free_blocks=F/T".
  std::vector<std::string> list_engines(std::chrono::milliseconds timeout);
  // One look at every actor of every node and every scheduler's load (node/inspection.hpp), as
  // the controller's JSON; nodes that did not answer in time are in it as unreachable.
  std::string inspect(std::chrono::milliseconds timeout);

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace troupe
