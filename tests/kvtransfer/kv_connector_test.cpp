// The KV connector without actors: one per engine instance, on stories260K. A decode instance's
// reservation opens its receiver and answers where to send; the prefill instance's runner sink
// streams each layer it writes there; the decode model then computes what the prefill model
// would have. Also: no listener before the first reservation, a cancel that frees the lease, a
// device transport refused by name on a host pool, and the sink keeping its connector alive.

#include <gtest/gtest.h>

#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "kvtransfer/kv_connector.hpp"
#include "tests/kvtransfer/kv_plane_support.hpp"
#include "tests/kvtransfer/kv_stream_steps.hpp"

namespace troupe::test {
namespace {

// A connector over a model the fixture owns (an empty owner: the fixture outlives it).
std::shared_ptr<model> borrowed(model& m) { return std::shared_ptr<model>(std::shared_ptr<void>{}, &m); }

class kv_connector_test : public kv_plane_test {
 protected:
  kv_connector_settings over_the_socket() const {
    kv_connector_settings settings;
    settings.channel.allow_direct = false;  // plain TCP, as between two processes
    settings.transfer_timeout = 60s;
    return settings;
  }

  kv_reservation reservation(uint64_t transfer_id) const {
    return kv_reservation{request_id, transfer_id, blocks_b, num_tokens, "prefill"};
  }

  // What the runner does for the prompt, in two chunks.
  void compute_prompt(kv_layer_sink& sink) {
    stream_prompt(sink, request_id, kv_transfer_prompt, blocks_a, {0, 6, num_tokens}, num_layers());
  }
};

TEST_F(kv_connector_test, a_reservation_answered_and_a_streamed_prefill_land_the_prefill_sides_kv) {
  event_log received;
  auto decode = std::make_shared<kv_connector>(borrowed(*b_), over_the_socket(), received.receiver_events());
  auto prefill = std::make_shared<kv_connector>(borrowed(*a_), over_the_socket(), kv_receiver_events{});
  std::unique_ptr<kv_layer_sink> sink = prefill->make_layer_sink();

  const kv_destination where = decode->expect(reservation(7), 60s);
  EXPECT_EQ(where.request_id, request_id);
  EXPECT_EQ(where.transfer_id, 7u);
  EXPECT_FALSE(where.endpoint.empty());
  EXPECT_TRUE(where.kv_pool_handle.empty()) << "a host transport names no device pool";
  EXPECT_TRUE(where.block_ids.empty());
  EXPECT_EQ(decode->leases().num_expected, 1);

  // The prefill computes before the destination is known (as when the router's word is late).
  sink->start(request_id, 7);
  compute_prompt(*sink);
  EXPECT_EQ(prefill->leases().num_sending, 1);
  prefill->send_to(where);
  const auto done = received.wait_for(7);
  ASSERT_TRUE(done);
  ASSERT_TRUE(done->completed) << done->why;
  EXPECT_EQ(decode_on_b(), expected_);
  EXPECT_EQ(decode->leases().num_expected, 0);
  EXPECT_TRUE(eventually([&] { return prefill->leases().num_sending == 0; }));
  EXPECT_EQ(decode->leases().num_refused_frames, 0u);
}

TEST_F(kv_connector_test, opens_no_receiver_before_its_first_reservation_and_a_cancel_ends_the_lease) {
  event_log received;
  auto decode = std::make_shared<kv_connector>(borrowed(*b_), over_the_socket(), received.receiver_events());
  const kv_connector_leases before = decode->leases();
  EXPECT_EQ(before.num_expected, 0);
  EXPECT_EQ(before.num_sending, 0);
  decode->cancel(3);  // nothing reserved, no receiver: nothing happens
  decode->expect(reservation(3), 60s);
  EXPECT_EQ(decode->leases().num_expected, 1);
  decode->cancel(3);
  EXPECT_EQ(decode->leases().num_expected, 0);
  EXPECT_EQ(received.count(3), 0u) << "a cancelled lease reports nothing";
}

TEST_F(kv_connector_test, a_device_transport_is_refused_by_name_for_a_pool_in_host_memory) {
  for (kv_transport transport : {kv_transport::cuda_ipc, kv_transport::nccl}) {
    kv_connector_settings settings = over_the_socket();
    settings.transport = transport;
    try {
      kv_connector connector(borrowed(*a_), settings, kv_receiver_events{});
      ADD_FAILURE() << kv_transport_name(transport) << " was accepted for the CPU backend's pool";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("kv_transport \"" + std::string(kv_transport_name(transport)) + "\""),
                std::string::npos)
          << e.what();
    }
  }
}

// A transfer the prefill side gives up (no destination by its deadline) is reported through the
// sender events, with its id: the KV agent tells the router, which re-runs the request at once.
TEST_F(kv_connector_test, a_transfer_the_sender_gives_up_is_reported) {
  std::mutex mutex;
  std::vector<std::pair<uint64_t, std::string>> failed;
  kv_connector_settings settings = over_the_socket();
  settings.transfer_timeout = 200ms;
  auto prefill = std::make_shared<kv_connector>(borrowed(*a_), settings, kv_receiver_events{},
                                                kv_sender_events{[&](uint64_t transfer_id, const std::string& why) {
                                                  std::lock_guard lock(mutex);
                                                  failed.emplace_back(transfer_id, why);
                                                }});
  std::unique_ptr<kv_layer_sink> sink = prefill->make_layer_sink();
  sink->start(request_id, 11);
  compute_prompt(*sink);  // no send_to: the decode side never reserved
  ASSERT_TRUE(eventually([&] {
    std::lock_guard lock(mutex);
    return !failed.empty();
  }));
  std::lock_guard lock(mutex);
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_EQ(failed[0].first, 11u);
  EXPECT_NE(failed[0].second.find("no ready"), std::string::npos) << failed[0].second;
}

TEST_F(kv_connector_test, the_runners_sink_keeps_its_connector_alive) {
  auto prefill = std::make_shared<kv_connector>(borrowed(*a_), over_the_socket(), kv_receiver_events{});
  std::unique_ptr<kv_layer_sink> sink = prefill->make_layer_sink();
  const std::weak_ptr<kv_connector> watch = prefill;
  prefill.reset();  // the KV agent ended first
  ASSERT_FALSE(watch.expired()) << "the sink writes into the connector's sender";
  sink->start(request_id, 9);
  compute_prompt(*sink);
  sink->forget(request_id, false);
  sink.reset();
  EXPECT_TRUE(watch.expired());
}

}  // namespace
}  // namespace troupe::test
