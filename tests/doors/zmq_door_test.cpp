// The ZeroMQ door as a plain class, on a real socket but without an actor system: a failure while
// handling one message costs that message only, never the door's thread (whose end would end the
// process), and the door goes on answering.

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <string>

#include <zmq.hpp>

#include "doors/zmq_door.hpp"
#include "protocol/codec.hpp"

namespace troupe {
namespace {

// Refuses every request by throwing, as a broken stage hand-off would; answers stats queries.
class throwing_downstream : public door_downstream {
 public:
  zmq_door* door = nullptr;
  std::atomic<int> num_submits{0};

  void submit(tokenize_request) override {
    ++num_submits;
    throw std::runtime_error("downstream refused the request");
  }
  void abort(int64_t) override {}
  void query_stats(uint64_t tag) override { door->post(stats_answer{tag, 7, 8, 0, 0, {}}); }
  void query_trace(uint64_t, duration_ns) override {}  // the ZeroMQ door asks for no trace
};

// The next reply on `socket`, or nullopt after `within`.
std::optional<server_reply> next_reply(zmq::socket_t& socket, std::chrono::milliseconds within) {
  zmq::pollitem_t item{socket.handle(), 0, ZMQ_POLLIN, 0};
  if (zmq::poll(&item, 1, within) <= 0) return std::nullopt;
  zmq::message_t message;
  if (!socket.recv(message, zmq::recv_flags::dontwait)) return std::nullopt;
  return decode_reply(message.to_string_view());
}

// An ipc endpoint of this process, its socket file removed however the test ends.
class ipc_endpoint {
 public:
  ipc_endpoint()
      : path_((std::filesystem::temp_directory_path() / ("troupe-zmq-door-test-" + std::to_string(::getpid())))
                  .string()) {
    std::filesystem::remove(path_);
  }
  ~ipc_endpoint() { std::filesystem::remove(path_); }
  std::string address() const { return "ipc://" + path_; }

 private:
  std::string path_;
};

TEST(zmq_door, a_failure_handling_one_message_leaves_the_door_serving) {
  const ipc_endpoint ipc;
  const std::string endpoint = ipc.address();
  request_admission admission(16);
  throwing_downstream downstream;
  zmq_door_options options;
  options.endpoint = endpoint;
  zmq_door door(options, downstream, admission);
  downstream.door = &door;
  door.start();

  zmq::context_t context(1);
  zmq::socket_t client(context, zmq::socket_type::dealer);
  client.set(zmq::sockopt::linger, 0);
  client.connect(endpoint);
  for (int round = 0; round < 2; ++round) {
    generate_request request;
    request.id = "g" + std::to_string(round);
    request.prompt = "Once upon a time";
    (void)client.send(zmq::buffer(encode_request(request)), zmq::send_flags::none);
    stats_request stats;
    stats.id = "s" + std::to_string(round);
    (void)client.send(zmq::buffer(encode_request(stats)), zmq::send_flags::none);
    // The throw is contained to the generate request: the stats request after it is answered.
    const auto reply = next_reply(client, std::chrono::seconds(10));
    ASSERT_TRUE(reply) << "round " << round << ": no stats reply";
    const auto* answer = std::get_if<stats_reply>(&*reply);
    ASSERT_TRUE(answer) << "round " << round << ": expected the stats reply";
    EXPECT_EQ(answer->id, "s" + std::to_string(round));
    EXPECT_EQ(answer->num_free_blocks, 7);
  }
  EXPECT_EQ(downstream.num_submits.load(), 2);
  door.stop();
}

}  // namespace
}  // namespace troupe
