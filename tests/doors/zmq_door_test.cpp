// The ZeroMQ door as a plain class, on a real socket but without an actor system: a failure while
// handling one message costs that message only, never the door's thread (whose end would end the
// process), and the door goes on answering.

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <string>
#include <mutex>
#include <thread>
#include <vector>

#include <zmq.hpp>

#include "doors/zmq_door.hpp"
#include "protocol/codec.hpp"
#include "tests/loopback_socket.hpp"

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

// Issue 25: libzmq accepts every connection it is offered, so a flood of silent connections held
// one descriptor each in the door (up to the process's last) until libzmq's handshake interval.
// The door's own listener holds at most its pending slots, and a real client still gets in.
TEST(zmq_door, a_flood_of_silent_connections_holds_no_more_descriptors_than_the_pending_slots) {
  request_admission admission(16);
  throwing_downstream downstream;
  zmq_door_options options;
  options.endpoint = "tcp://127.0.0.1:*";
  options.max_pending_handshakes = 32;
  options.max_connections = 64;
  zmq_door door(options, downstream, admission);
  downstream.door = &door;
  door.start();
  const std::string& endpoint = door.bound_endpoint();
  const uint16_t port = static_cast<uint16_t>(std::stoi(endpoint.substr(endpoint.rfind(':') + 1)));

  const size_t before = testing::open_descriptors();
  std::vector<int> flood;
  for (int i = 0; i < 400; ++i) {
    const int fd = testing::connect_loopback(port);
    if (fd >= 0) flood.push_back(fd);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // the door has taken what it will
  const size_t held_by_door = testing::open_descriptors() - before - flood.size();
  EXPECT_LE(held_by_door, 32u + 4u) << "the door holds " << held_by_door << " descriptors for " << flood.size()
                                    << " silent connections";
  EXPECT_GT(door.connections().num_evicted, 0u);

  zmq::context_t context(1);
  zmq::socket_t client(context, zmq::socket_type::dealer);
  client.set(zmq::sockopt::linger, 0);
  client.connect(endpoint);
  stats_request stats;
  stats.id = "s";
  (void)client.send(zmq::buffer(encode_request(stats)), zmq::send_flags::none);
  const auto reply = next_reply(client, std::chrono::seconds(10));
  ASSERT_TRUE(reply) << "no stats reply during the flood";
  const auto* answer = std::get_if<stats_reply>(&*reply);
  ASSERT_TRUE(answer);
  EXPECT_EQ(answer->num_free_blocks, 7);
  for (int fd : flood) ::close(fd);
  door.stop();
}

TEST(zmq_door, names_an_endpoint_it_cannot_read) {
  request_admission admission(16);
  throwing_downstream downstream;
  for (const std::string endpoint : {"tcp://127.0.0.1:99999", "tcp://127.0.0.1:port", "tcp://5557"}) {
    zmq_door_options options;
    options.endpoint = endpoint;
    zmq_door door(options, downstream, admission);
    try {
      door.start();
      ADD_FAILURE() << endpoint << " accepted";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(endpoint), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace troupe

namespace troupe {
namespace {

// Keeps what the door submits.
class recording_downstream : public door_downstream {
 public:
  std::mutex mutex;
  std::vector<tokenize_request> submitted;
  void submit(tokenize_request request) override {
    std::lock_guard lock(mutex);
    submitted.push_back(std::move(request));
  }
  void abort(int64_t) override {}
  void query_stats(uint64_t) override {}
  void query_trace(uint64_t, duration_ns) override {}
};

TEST(zmq_door, a_tenants_key_is_let_in_pins_its_tenant_and_brings_its_defaults) {
  const ipc_endpoint ipc;
  request_admission admission(16);
  recording_downstream downstream;
  zmq_door_options options;
  options.endpoint = ipc.address();
  options.api_key = "server-key";
  options.tenants = std::make_shared<const tenant_table>(
      std::vector<tenant_settings>{{"chat", "key-chat", 2, 200, 50}, {"batch", "", 0, 900, 0}});
  zmq_door door(options, downstream, admission);
  door.start();
  zmq::context_t context(1);
  zmq::socket_t client(context, zmq::socket_type::dealer);
  client.set(zmq::sockopt::linger, 0);
  client.connect(ipc.address());
  auto send = [&](const std::string& id, const std::string& key, const std::string& claimed) {
    generate_request request;
    request.id = id;
    request.prompt = "Once upon a time";
    request.api_key = key;
    request.targets.tenant = claimed;
    (void)client.send(zmq::buffer(encode_request(request)), zmq::send_flags::none);
  };
  send("wrong", "key-chatty", "chat");
  const auto refusal = next_reply(client, std::chrono::seconds(10));
  ASSERT_TRUE(refusal);
  const auto* error = std::get_if<error_reply>(&*refusal);
  ASSERT_TRUE(error);
  EXPECT_EQ(error->code, error_code::unauthorized);
  send("tenant-key", "key-chat", "batch");    // the key says chat, whatever it claims
  send("server-key", "server-key", "batch");  // the server's key: the tenant it names
  for (int i = 0; i < 200; ++i) {
    {
      std::lock_guard lock(downstream.mutex);
      if (downstream.submitted.size() == 2) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  door.stop();
  ASSERT_EQ(downstream.submitted.size(), 2u);
  EXPECT_EQ(downstream.submitted[0].targets.tenant, "chat");
  EXPECT_EQ(downstream.submitted[0].priority, 2);
  EXPECT_EQ(downstream.submitted[0].targets.ttft_ms, 200);
  EXPECT_EQ(downstream.submitted[0].targets.tpot_ms, 50);
  EXPECT_EQ(downstream.submitted[1].targets.tenant, "batch");
  EXPECT_EQ(downstream.submitted[1].targets.ttft_ms, 900);
}

}  // namespace
}  // namespace troupe
