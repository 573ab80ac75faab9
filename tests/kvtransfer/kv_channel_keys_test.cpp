// CURVE on the KV data plane: the key files troupe certs writes, a receiver that lets only the
// cluster's members in (a sender with a member's keys gets a transfer through, bitwise equal),
// and peers without valid keys that get nothing through.

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/stat.h>
#include <zmq.h>

#include <fstream>
#include <zmq.hpp>

#include "kvtransfer/kv_channel.hpp"
#include "tests/loopback_socket.hpp"
#include "tests/kvtransfer/kv_plane_support.hpp"

namespace troupe::test {
namespace {

namespace fs = std::filesystem;

class temporary_dir {
 public:
  temporary_dir() {
    std::string pattern = (fs::temp_directory_path() / "troupe-kv-keys-XXXXXX").string();
    if (!::mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~temporary_dir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

void expect_load_refused(const fs::path& dir, const std::string& name, const std::string& words) {
  try {
    load_kv_channel_keys(dir, name);
    ADD_FAILURE() << "loaded, expected an error saying " << words;
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
  }
}

TEST(kv_channel_keys, written_keys_load_with_every_member_allowed) {
  temporary_dir dir;
  write_kv_channel_keys(dir.path(), "node1");
  write_kv_channel_keys(dir.path(), "node2");
  const kv_channel_keys one = load_kv_channel_keys(dir.path(), "node1");
  const kv_channel_keys two = load_kv_channel_keys(dir.path(), "node2");
  EXPECT_EQ(one.public_key.size(), 40u);
  EXPECT_EQ(one.secret_key.size(), 40u);
  EXPECT_NE(one.public_key, two.public_key);
  EXPECT_FALSE(one.empty());
  std::vector<std::string> both = {one.public_key, two.public_key};
  std::sort(both.begin(), both.end());
  EXPECT_EQ(one.allowed_public_keys, both);
  EXPECT_EQ(two.allowed_public_keys, both);
  struct stat st {};
  ASSERT_EQ(::stat((dir.path() / "node1.kv.key").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u) << "the secret key is readable by others";
  std::ifstream pub(dir.path() / "node1.kv.pub");
  std::string key;
  pub >> key;
  EXPECT_EQ(key, one.public_key);
}

TEST(kv_channel_keys, existing_keys_are_kept_unless_replaced) {
  temporary_dir dir;
  write_kv_channel_keys(dir.path(), "node1");
  const std::string before = load_kv_channel_keys(dir.path(), "node1").public_key;
  EXPECT_THROW(write_kv_channel_keys(dir.path(), "node1"), std::runtime_error);
  EXPECT_EQ(load_kv_channel_keys(dir.path(), "node1").public_key, before);
  write_kv_channel_keys(dir.path(), "node1", true);
  EXPECT_NE(load_kv_channel_keys(dir.path(), "node1").public_key, before);
}

TEST(kv_channel_keys, missing_or_malformed_files_are_named) {
  temporary_dir dir;
  expect_load_refused(dir.path(), "node1", "node1.kv.key");
  write_kv_channel_keys(dir.path(), "node1");
  write_kv_channel_keys(dir.path(), "node2");
  const kv_channel_keys two = load_kv_channel_keys(dir.path(), "node2");
  std::ofstream(dir.path() / "node1.kv.key") << "public " << two.public_key << "\nsecret short\n";
  expect_load_refused(dir.path(), "node1", "secret key is not 40 characters");
  // Two valid keys that are not a pair: node2's public key with node1's... any other secret.
  char other_public[41], other_secret[41];
  ASSERT_EQ(zmq_curve_keypair(other_public, other_secret), 0);
  std::ofstream(dir.path() / "node1.kv.key") << "public " << two.public_key << "\nsecret " << other_secret << "\n";
  expect_load_refused(dir.path(), "node1", "does not belong");
  std::ofstream(dir.path() / "node1.kv.key") << "public " << other_public << "\nsecret " << other_secret << "\n";
  std::ofstream(dir.path() / "stray.kv.pub") << "not-a-key\n";
  expect_load_refused(dir.path(), "node1", "stray.kv.pub");
}

// Two members' keys and a stranger's, made fresh for each test.
class kv_curve_test : public kv_plane_test {
 protected:
  void SetUp() override {
    kv_plane_test::SetUp();
    if (IsSkipped()) return;
    write_kv_channel_keys(dir_.path(), "decode");
    write_kv_channel_keys(dir_.path(), "prefill");
    decode_keys_ = load_kv_channel_keys(dir_.path(), "decode");
    prefill_keys_ = load_kv_channel_keys(dir_.path(), "prefill");
    write_kv_channel_keys(stranger_dir_.path(), "stranger");
    stranger_keys_ = load_kv_channel_keys(stranger_dir_.path(), "stranger");
    kv_channel_settings settings;
    settings.keys = decode_keys_;
    receiver_ = std::make_unique<kv_receiver>(*b_, settings, log_.receiver_events());
    pool_before_ = whole_pool_of_b();
  }

  // A sender that must use the socket (the receiver is in this process) with `keys`.
  std::unique_ptr<kv_sender> sender_with(const kv_channel_keys& keys) {
    kv_channel_settings settings;
    settings.allow_direct = false;
    settings.keys = keys;
    settings.linger = std::chrono::milliseconds(100);
    return std::make_unique<kv_sender>(settings, kv_sender_events{});
  }

  temporary_dir dir_, stranger_dir_;
  kv_channel_keys decode_keys_, prefill_keys_, stranger_keys_;
  event_log log_;
  std::unique_ptr<kv_receiver> receiver_;
  std::vector<std::byte> pool_before_;
};

TEST_F(kv_curve_test, a_member_gets_a_transfer_through_that_continues_bitwise_equal) {
  EXPECT_EQ(receiver_->public_key(), decode_keys_.public_key);
  auto sender = sender_with(prefill_keys_);
  receiver_->expect(expectation(7));
  sender->open(7, in(60s));
  sender->ready(7, receiver_->endpoint(), receiver_->public_key());
  send_whole_prompt(*sender, 7);
  const auto done = log_.wait_for(7);
  ASSERT_TRUE(done) << receiver_->stats().last_refusal;
  EXPECT_TRUE(done->completed) << done->why;
  EXPECT_EQ(decode_on_b(), expected_);
  EXPECT_EQ(receiver_->stats().num_refused_peers, 0u);
}

// The CURVE receiver's port is a relay_listener (libzmq's own listener accepted every connection
// until the process had no descriptor left, issue 25): a flood of idle connections holds at most
// its pending slots, the oldest are closed at once to make room, and a member still gets its
// transfer through while the flood is held.
TEST_F(kv_curve_test, a_flood_of_idle_connections_is_bounded_and_a_member_still_gets_through) {
  const std::string& endpoint = receiver_->endpoint();
  const uint16_t port = static_cast<uint16_t>(std::stoi(endpoint.substr(endpoint.rfind(':') + 1)));
  const size_t before = testing::open_descriptors();
  constexpr size_t num_flood = 300;
  std::vector<int> flood;
  for (size_t i = 0; i < num_flood; ++i) {
    const int fd = testing::connect_loopback(port);
    if (fd >= 0) flood.push_back(fd);
  }
  ASSERT_EQ(flood.size(), num_flood);
  std::this_thread::sleep_for(300ms);
  // Each client's own descriptor aside, the receiver holds one per pending connection (16 slots)
  // and its listener's spare; libzmq's listener held one per connection.
  const size_t open = testing::open_descriptors();
  const size_t held = open > before + flood.size() ? open - before - flood.size() : 0;
  EXPECT_LE(held, 16u + 4u) << "descriptors held by the receiver for " << num_flood << " idle connections";
  size_t num_closed = 0;
  for (int fd : flood) {
    pollfd p{fd, POLLIN, 0};
    char byte;
    if (::poll(&p, 1, 0) > 0 && ::recv(fd, &byte, 1, MSG_DONTWAIT) <= 0) ++num_closed;
  }
  EXPECT_GE(num_closed, num_flood - 16) << "idle connections closed to make room";

  // Promptly: a member connecting evicts the oldest silent one rather than waiting for the
  // flood's handshake deadlines (5 s).
  const auto start = std::chrono::steady_clock::now();
  auto sender = sender_with(prefill_keys_);
  receiver_->expect(expectation(7));
  sender->open(7, in(60s));
  sender->ready(7, receiver_->endpoint(), receiver_->public_key());
  send_whole_prompt(*sender, 7);
  const auto done = log_.wait_for(7);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s) << "the transfer waited for the flood to time out";
  for (int fd : flood) ::close(fd);
  ASSERT_TRUE(done) << receiver_->stats().last_refusal;
  EXPECT_TRUE(done->completed) << done->why;
  EXPECT_EQ(decode_on_b(), expected_);
}

TEST_F(kv_curve_test, a_sender_with_an_unknown_key_gets_nothing_through) {
  auto sender = sender_with(stranger_keys_);
  receiver_->expect(expectation(7));
  sender->open(7, in(60s));
  sender->ready(7, receiver_->endpoint(), receiver_->public_key());
  send_whole_prompt(*sender, 7);
  ASSERT_TRUE(eventually([&] { return receiver_->stats().num_refused_peers >= 1; }))
      << "the stranger's connection was not refused";
  const kv_receiver_stats stats = receiver_->stats();
  EXPECT_NE(stats.last_refusal.find(stranger_keys_.public_key), std::string::npos) << stats.last_refusal;
  EXPECT_EQ(stats.num_frames, 0u);
  EXPECT_EQ(stats.num_expected, 1u);
  EXPECT_EQ(log_.size(), 0u);
  EXPECT_EQ(whole_pool_of_b(), pool_before_);
}

TEST_F(kv_curve_test, a_plain_socket_without_curve_gets_nothing_through) {
  receiver_->expect(expectation(7));
  const frame f = frame_of(7, 0, 1, 0, num_tokens);
  zmq::context_t context(1);
  zmq::socket_t push(context, zmq::socket_type::push);
  push.set(zmq::sockopt::linger, 0);
  push.connect(receiver_->endpoint());
  const std::vector<std::byte> header = f.header_bytes();
  push.send(zmq::buffer(header), zmq::send_flags::sndmore);
  push.send(zmq::buffer(f.payload), zmq::send_flags::none);
  ASSERT_TRUE(eventually([&] { return receiver_->stats().num_refused_peers >= 1; }))
      << "the plain connection was not refused";
  EXPECT_EQ(receiver_->stats().num_frames, 0u);
  EXPECT_EQ(receiver_->stats().num_refused, 0u);  // no frame even reached the checks
  EXPECT_EQ(whole_pool_of_b(), pool_before_);
}

TEST_F(kv_curve_test, a_sender_without_keys_is_told_why_when_the_receiver_wants_curve) {
  kv_channel_settings settings;
  settings.allow_direct = false;
  event_log sent;
  kv_sender sender(settings, sent.sender_events());
  sender.open(7, in(60s));
  send_whole_prompt(sender, 7);
  sender.ready(7, receiver_->endpoint(), receiver_->public_key());
  const auto failed = sent.wait_for(7);
  ASSERT_TRUE(failed);
  EXPECT_NE(failed->why.find("wants CURVE, this sender has no keys"), std::string::npos) << failed->why;
}

}  // namespace
}  // namespace troupe::test
