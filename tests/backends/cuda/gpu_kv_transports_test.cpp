// The GPU transports of the KV data plane (issue 11), kvtransfer/cuda_ipc_kv_copier and
// kvtransfer/nccl_kv_channel: bytes land in the right blocks of the other pool and nowhere else,
// refusals come before any copy, and a peer that never comes is given up at the deadline. CUDA
// IPC needs two processes: the test runs its own binary again as the sending side. Skips without
// a GPU (and the NCCL pair test without two).

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "kvtransfer/cuda_ipc_kv_copier.hpp"
#include "kvtransfer/device_kv_runs.hpp"
#include "tests/backends/cuda/cuda_test_util.hpp"
#if TROUPE_KV_NCCL
#include "kvtransfer/nccl_kv_channel.hpp"
#endif

extern char** environ;

namespace troupe {
namespace {

using namespace std::chrono_literals;

constexpr int num_layers = 2, num_blocks = 8;
constexpr size_t block_bytes = 64;
constexpr const char* handle_variable = "TROUPE_TEST_CUDA_IPC_HANDLE";
const std::vector<int32_t> sender_blocks = {1, 2, 3, 6};
const std::vector<int32_t> receiver_blocks = {4, 5, 6, 0};  // 1..3 -> 4..6 is one run; 6 -> 0 another

size_t pool_bytes() { return size_t(num_layers) * 2 * num_blocks * block_bytes; }

// The sending side's pool: every byte says where it is.
std::vector<uint8_t> patterned_pool() {
  std::vector<uint8_t> bytes(pool_bytes());
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>((i * 7 + i / block_bytes * 13 + 1) & 0xff);
  return bytes;
}

device_kv_pool pool_at(void* base, int device = 0) {
  return device_kv_pool{device, base, num_layers, num_blocks, block_bytes, dtype::bf16};
}

// What the receiving pool must hold after layers [0, num_layers) of sender_blocks moved into
// receiver_blocks of a pool of zeros.
std::vector<uint8_t> expected_receiver_pool() {
  const std::vector<uint8_t> source = patterned_pool();
  std::vector<uint8_t> expected(pool_bytes(), 0);
  const device_kv_pool geometry = pool_at(nullptr);
  for (int layer = 0; layer < num_layers; ++layer) {
    for (int side = 0; side < 2; ++side) {
      for (size_t i = 0; i < sender_blocks.size(); ++i) {
        const size_t from = device_kv_offset(geometry, layer, side, sender_blocks[i]);
        const size_t to = device_kv_offset(geometry, layer, side, receiver_blocks[i]);
        std::copy(source.begin() + from, source.begin() + from + block_bytes, expected.begin() + to);
      }
    }
  }
  return expected;
}

std::string to_hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string hex;
  for (unsigned char c : bytes) {
    hex += digits[c >> 4];
    hex += digits[c & 15];
  }
  return hex;
}

std::string from_hex(const std::string& hex) {
  std::string bytes;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) bytes += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
  return bytes;
}

// A child process that is killed and reaped however the test ends.
class child_process {
 public:
  child_process(const std::vector<std::string>& args, const std::vector<std::string>& extra_env) {
    std::vector<char*> argv, envp;
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    for (char** e = environ; *e; ++e) envp.push_back(*e);
    for (const std::string& e : extra_env) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);
    if (posix_spawn(&pid_, "/proc/self/exe", nullptr, nullptr, argv.data(), envp.data()) != 0) pid_ = -1;
  }
  ~child_process() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  bool started() const { return pid_ > 0; }
  // The exit status, waiting at most `timeout`; -1 when it did not exit in time (then killed).
  int wait(std::chrono::milliseconds timeout) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < until) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(10ms);
    }
    return -1;
  }

 private:
  pid_t pid_ = -1;
};

TEST(cuda_ipc_kv_copier, copies_each_layer_into_the_reserved_blocks_of_another_processes_pool) {
  TROUPE_REQUIRE_GPU();
  cuda::device_buffer receiver_pool(pool_bytes());  // the decode side's, zeros
  cuda::check(cudaMemset(receiver_pool.get(), 0, pool_bytes()), "zero the pool");
  cuda::check(cudaDeviceSynchronize(), "sync");
  const std::string handle = cuda_ipc_pool_handle(pool_at(receiver_pool.get()));
  child_process sender({"/proc/self/exe", "--gtest_filter=cuda_ipc_kv_copier_child.*"},
                       {std::string(handle_variable) + "=" + to_hex(handle)});
  ASSERT_TRUE(sender.started());
  ASSERT_EQ(sender.wait(60s), 0) << "the sending process failed (its output is above)";
  EXPECT_EQ(cuda::testing::from_device_raw<uint8_t>(receiver_pool.get(), pool_bytes()), expected_receiver_pool());
}

// The sending side of the test above, in its own process; skips when run on its own.
TEST(cuda_ipc_kv_copier_child, sends_from_its_pool) {
  const char* hex = std::getenv(handle_variable);
  if (!hex) GTEST_SKIP() << "the sending half of cuda_ipc_kv_copier's test: runs only as its child process";
  TROUPE_REQUIRE_GPU();
  const std::vector<uint8_t> pattern = patterned_pool();
  cuda::device_buffer local = cuda::testing::to_device_raw(pattern);
  cuda_ipc_kv_copier copier(pool_at(local.get()));
  // Layer by layer, as a prefill sends them; the peer's handle is opened once.
  for (int layer = 0; layer < num_layers; ++layer) {
    copier.copy_to(from_hex(hex), sender_blocks, receiver_blocks, layer, 1, std::chrono::steady_clock::now() + 10s);
  }
  EXPECT_EQ(copier.num_open_peers(), 1u);
}

TEST(cuda_ipc_kv_copier, a_peer_pool_that_does_not_fit_is_refused_before_any_copy) {
  TROUPE_REQUIRE_GPU();
  cuda::device_buffer local(pool_bytes()), other(pool_bytes() * 2);
  cuda_ipc_kv_copier copier(pool_at(local.get()));
  device_kv_pool f16 = pool_at(other.get());
  f16.element = dtype::f16;
  // Refused from the handle's geometry alone: the handle is never opened (in this process it
  // could not be).
  auto expect_refused = [&](const std::string& handle, std::vector<int32_t> to, const std::string& field) {
    try {
      copier.copy_to(handle, sender_blocks, to, 0, 1, std::chrono::steady_clock::now() + 10s);
      ADD_FAILURE() << "copied, expected a refusal naming " << field;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
    EXPECT_EQ(copier.num_open_peers(), 0u);
  };
  expect_refused(cuda_ipc_pool_handle(f16), receiver_blocks, "element types bf16 and f16 differ");
  expect_refused(cuda_ipc_pool_handle(pool_at(other.get())), {4, 5, 6, 8}, "destination block id 8");
  expect_refused("not a handle", receiver_blocks, "cuda ipc handle: 12 bytes");
}

#if TROUPE_KV_NCCL
TEST(nccl_kv_channel, a_peer_that_never_joins_is_given_up_at_the_deadline) {
  TROUPE_REQUIRE_GPU();
  cuda::device_buffer local(pool_bytes());
  const auto start = std::chrono::steady_clock::now();
  try {
    nccl_kv_channel channel(pool_at(local.get()), make_nccl_unique_id(), nccl_kv_channel::side::prefill, start + 2s);
    ADD_FAILURE() << "joined a pair of two alone";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("deadline"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 30s);  // bounded, not hung
}

TEST(nccl_kv_channel, each_layer_lands_in_the_receivers_blocks) {
  TROUPE_REQUIRE_GPU();
  int count = 0;
  cudaGetDeviceCount(&count);
  if (count < 2) GTEST_SKIP() << "an NCCL pair needs two GPUs (NCCL refuses two ranks on one)";
  const std::vector<uint8_t> pattern = patterned_pool();
  cuda::check(cudaSetDevice(0), "cudaSetDevice");
  cuda::device_buffer sender_pool = cuda::testing::to_device_raw(pattern);
  cuda::check(cudaSetDevice(1), "cudaSetDevice");
  cuda::device_buffer receiver_pool(pool_bytes());
  cuda::check(cudaMemset(receiver_pool.get(), 0, pool_bytes()), "zero the pool");
  cuda::check(cudaDeviceSynchronize(), "sync");
  const std::string id = make_nccl_unique_id();
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  std::string receiver_error;
  std::thread decode([&] {
    try {
      nccl_kv_channel channel(pool_at(receiver_pool.get(), 1), id, nccl_kv_channel::side::decode, deadline);
      for (int layer = 0; layer < num_layers; ++layer) channel.transfer(receiver_blocks, layer, 1, deadline);
    } catch (const std::exception& e) {
      receiver_error = e.what();
    }
  });
  std::string sender_error;
  try {
    nccl_kv_channel channel(pool_at(sender_pool.get(), 0), id, nccl_kv_channel::side::prefill, deadline);
    for (int layer = 0; layer < num_layers; ++layer) channel.transfer(sender_blocks, layer, 1, deadline);
  } catch (const std::exception& e) {
    sender_error = e.what();
  }
  decode.join();
  EXPECT_EQ(sender_error, "");
  EXPECT_EQ(receiver_error, "");
  cuda::check(cudaSetDevice(1), "cudaSetDevice");
  EXPECT_EQ(cuda::testing::from_device_raw<uint8_t>(receiver_pool.get(), pool_bytes()), expected_receiver_pool());
}
#endif

}  // namespace
}  // namespace troupe
