// KV transfer throughput on loopback (issue 11): the KV data plane (kv_sender -> kv_receiver over
// ZeroMQ, over plain TCP, and over ZeroMQ with CURVE) against a plain TCP socket copy of the same
// bytes, side by side in one run, and the plane over plain TCP importing into a CPU model's pool.
// "TCP, alloc/frame" is the plane over TCP with each payload allocated afresh, as the exporter
// did before the sender recycled its buffers: the before and after of that change, interleaved.
// "TCP, transport" is the plane over TCP with every frame exported before the clock starts: the
// transport alone, timed as the plain copy is (whose payloads are also ready beforehand), which
// tells the channel's cost from the export's (a copy out of the pool the plain copy never makes).
//
// A transfer of S MiB is sent as it is in serving: one frame per layer of a 12-layer model
// (12 KV heads of 64, blocks of 16 tokens, f32), i.e. frames of about S/12, each frame's buffer
// taken from the sender's pool (kv_sender::take_buffer) and filled by a CPU model's export_kv, as
// kvtransfer/kv_layer_streamer does, inside the timed run (serving exports a layer while the previous
// one is on the wire). The plain TCP copy
// is the floor of what any channel on this machine can do: one blocking send loop and one
// blocking recv loop into a reused buffer, two threads of this process, 127.0.0.1. The plane's
// receiver checks every frame; its transport columns import into a model that copies nothing
// (the transport alone), the "+ import" column into a real CPU pool (converted per block run).
//
// Modes run interleaved, repeat by repeat, so that noise from the rest of the machine falls on
// all of them alike; each cell is best / median over the repeats. The last line is the CPU time
// (every thread of the process) the plain copy and the plane spend per transfer: on shared cores
// it says more about a transport's cost than wall time, which other work on the machine moves.
//
//   troupe_bench_kv_transfer [--sizes 16,64,256] [--reps 5]

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zmq.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <future>
#include <memory>
#include <numeric>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "backends/cpu/blas_core.hpp"
#include "backends/cpu/cpu_model.hpp"
#include "kvtransfer/kv_receiver.hpp"
#include "kvtransfer/kv_sender.hpp"
#include "model/loader/dummy_weights.hpp"

// The troupe process's jemalloc settings (cli/allocator_settings.cpp), so that the receiver's
// allocations behave as they do in serving.
extern "C" {
const char* malloc_conf = "oversize_threshold:0";
}

namespace {

using namespace troupe;
using clock_type = std::chrono::steady_clock;

constexpr int num_layers = 12;
constexpr int block_size = 16;

model_config bench_config() {
  model_config config;
  config.arch = architecture::llama;
  config.hidden_size = 768;
  config.intermediate_size = 3072;
  config.num_layers = num_layers;
  config.num_heads = 12;
  config.num_kv_heads = 12;
  config.head_dim = 64;
  config.vocab_size = 1000;
  config.max_position_embeddings = 8192;
  return config;
}

// A model that takes KV and keeps none: the receiver's checks and the socket, without the copy
// into a pool, so the channel is compared with the plain socket on equal terms.
class transport_only_model final : public model {
 public:
  transport_only_model(model_config config, int num_blocks) : config_(std::move(config)), num_blocks_(num_blocks) {}
  const model_config& config() const override { return config_; }
  kv_cache_shape kv_shape() const override { return {num_blocks_, block_size}; }
  std::string backend_name() const override { return "transport-only"; }
  void forward(const forward_batch&, float*) override { throw std::logic_error("transport-only model: no forward"); }
  dtype kv_dtype() const override { return dtype::f32; }
  void import_kv(std::span<const int32_t>, const kv_span_header&, std::span<const std::byte>) override {}

 private:
  model_config config_;
  int num_blocks_;
};

// One transfer's frames: per layer, the header and a payload of the span's bytes.
struct transfer_shape {
  int num_blocks = 0;
  kv_span_header layer_span;  // one layer, every block
  size_t frame_bytes = 0;
  size_t total_bytes() const { return frame_bytes * num_layers; }
};

transfer_shape shape_for(const model_config& config, size_t mib) {
  const size_t block_bytes = 2 * size_t(block_size) * config.num_kv_heads * config.head_dim * sizeof(float);
  transfer_shape s;
  s.num_blocks = static_cast<int>(std::max<size_t>(1, (mib << 20) / num_layers / block_bytes));
  s.layer_span = kv_span_for(config, {s.num_blocks, block_size}, s.num_blocks, 0, 1, dtype::f32);
  s.frame_bytes = kv_span_bytes(s.layer_span);
  return s;
}

std::vector<std::vector<std::byte>> make_payloads(const transfer_shape& s) {
  // Small finite floats, not NaN patterns: the import converts nothing but copies real values.
  std::vector<std::byte> one(s.frame_bytes);
  const float value = 0.25f;
  for (size_t i = 0; i + sizeof value <= one.size(); i += sizeof value)
    std::memcpy(one.data() + i, &value, sizeof value);
  return std::vector<std::vector<std::byte>>(num_layers, one);
}

// CPU seconds of the whole process so far (every thread, user + system): on a machine whose
// cores are shared, what a transport costs in CPU decides its throughput more than wall time
// shows in one run.
double process_cpu_seconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  auto seconds = [](const timeval& t) { return double(t.tv_sec) + double(t.tv_usec) / 1e6; };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

// CPU seconds of the calling thread so far (the exporter's share of a transfer).
double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) + double(t.tv_nsec) / 1e9;
}

// The process's resident memory now, in MiB (VmRSS): what recycled buffers, or an allocator that
// keeps freed pages, cost in memory.
double resident_mib() {
  std::FILE* status = std::fopen("/proc/self/status", "r");
  if (!status) return 0;
  char line[256];
  double kib = 0;
  while (std::fgets(line, sizeof line, status)) {
    if (std::sscanf(line, "VmRSS: %lf kB", &kib) == 1) break;
  }
  std::fclose(status);
  return kib / 1024;
}

// Minor page faults of the whole process so far: a fresh buffer's pages are faulted in (and
// zeroed by the kernel) on first touch, which is what recycled buffers avoid.
double process_minor_faults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return double(usage.ru_minflt);
}

// ---- plain TCP --------------------------------------------------------------------------

void check_syscall(bool ok, const char* what) {
  if (!ok) throw std::runtime_error(std::string(what) + ": " + std::strerror(errno));
}

void write_all(int fd, const std::byte* data, size_t size) {
  while (size > 0) {
    const ssize_t n = ::send(fd, data, size, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    check_syscall(n > 0, "send");
    data += n;
    size -= static_cast<size_t>(n);
  }
}

void read_all(int fd, std::byte* data, size_t size) {
  while (size > 0) {
    const ssize_t n = ::recv(fd, data, size, 0);
    if (n < 0 && errno == EINTR) continue;
    check_syscall(n > 0, "recv");
    data += n;
    size -= static_cast<size_t>(n);
  }
}

// The same frames (64-byte header, payload) over one TCP connection, made once (as the plane's
// is): per run, seconds until the receiving thread has read the last byte.
class plain_tcp {
 public:
  explicit plain_tcp(const transfer_shape& s) : shape_(s), in_payload_(s.frame_bytes) {
    const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
    check_syscall(listener >= 0, "socket");
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    check_syscall(::bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0, "bind");
    check_syscall(::listen(listener, 1) == 0, "listen");
    socklen_t length = sizeof address;
    check_syscall(::getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length) == 0, "getsockname");
    out_ = ::socket(AF_INET, SOCK_STREAM, 0);
    check_syscall(out_ >= 0, "socket");
    check_syscall(::connect(out_, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0, "connect");
    in_ = ::accept(listener, nullptr, nullptr);
    check_syscall(in_ >= 0, "accept");
    ::close(listener);
    kv_frame_header h;
    h.transfer_id = 1;
    h.token_end = s.num_blocks * block_size;
    h.span = s.layer_span;
    h.payload_bytes = s.frame_bytes;
    encode_kv_frame_header(h, std::span<std::byte, kv_frame_header_bytes>(header_.data(), kv_frame_header_bytes));
  }
  ~plain_tcp() {
    ::close(out_);
    ::close(in_);
  }

  // `fresh`: each payload is read into a new allocation (as ZeroMQ receives a message) instead
  // of the one reused, cache-warm buffer: tells the allocation's cost from the channel's.
  double run(const std::vector<std::vector<std::byte>>& payloads, bool fresh = false) {
    const auto start = clock_type::now();
    auto received = std::async(std::launch::async, [&] {
      std::array<std::byte, kv_frame_header_bytes> in_header;
      for (int i = 0; i < num_layers; ++i) {
        read_all(in_, in_header.data(), in_header.size());
        const kv_frame_header got = decode_kv_frame_header(in_header, shape_.frame_bytes);
        if (fresh) {
          std::unique_ptr<std::byte[]> buffer(new std::byte[got.payload_bytes]);  // uninitialized, like malloc
          read_all(in_, buffer.get(), got.payload_bytes);
        } else {
          read_all(in_, in_payload_.data(), got.payload_bytes);  // one buffer, reused
        }
      }
    });
    for (const auto& payload : payloads) {
      write_all(out_, header_.data(), header_.size());
      write_all(out_, payload.data(), payload.size());
    }
    received.get();
    return std::chrono::duration<double>(clock_type::now() - start).count();
  }

 private:
  transfer_shape shape_;
  std::array<std::byte, kv_frame_header_bytes> header_{};
  std::vector<std::byte> in_payload_;
  int out_ = -1, in_ = -1;
};

// ---- the KV data plane -------------------------------------------------------------------

// A receiver and a sender that stay up across repeats (as in serving: the connection is made
// once), forced through the socket.
class plane {
 public:
  // `recycled` off: each payload is a fresh allocation, freed after its write (the sender keeps
  // none), as kvtransfer/kv_layer_streamer allocated them before the sender's pool.
  plane(model& m, const transfer_shape& s, bool curve, bool plain_tcp = false, bool recycled = true)
      : shape_(s), recycled_(recycled) {
    kv_channel_settings receiver_settings, sender_settings;
    sender_settings.allow_direct = false;
    if (!recycled) sender_settings.max_pooled_bytes = 0;
    receiver_settings.plain_tcp = plain_tcp;
    if (curve) {
      receiver_settings.keys = make_keys();
      sender_settings.keys = make_keys();
      receiver_settings.keys.allowed_public_keys = {sender_settings.keys.public_key};
    }
    receiver_ =
        std::make_unique<kv_receiver>(m, receiver_settings,
                                      kv_receiver_events{[this](uint64_t, int64_t) { done_.set_value(true); },
                                                         [this](uint64_t, int64_t, const std::string& why) {
                                                           std::fprintf(stderr, "transfer failed: %s\n", why.c_str());
                                                           done_.set_value(false);
                                                         }});
    sender_ = std::make_unique<kv_sender>(sender_settings, kv_sender_events{[](uint64_t, const std::string& why) {
                                            std::fprintf(stderr, "send failed: %s\n", why.c_str());
                                          }});
  }

  // Wall seconds of one transfer of `exporter`'s blocks; `cpu_seconds` (if given): the process's
  // CPU time over it. `exported_before`: every frame is exported (into the sender's buffers)
  // before the clock starts, so the run times the transport alone, as the plain copy is timed.
  double run(const model& exporter, double* cpu_seconds = nullptr, double* export_seconds = nullptr,
             bool exported_before = false) {
    const uint64_t id = ++next_id_;
    std::vector<int32_t> blocks(shape_.num_blocks);
    std::iota(blocks.begin(), blocks.end(), 0);
    const int num_tokens = shape_.num_blocks * block_size;
    done_ = std::promise<bool>();
    auto done = done_.get_future();
    kv_expectation expectation;
    expectation.transfer_id = id;
    expectation.request_id = 1;
    expectation.block_ids = blocks;
    expectation.num_tokens = num_tokens;
    expectation.deadline = clock_type::now() + std::chrono::minutes(2);
    receiver_->expect(std::move(expectation));

    if (export_seconds) *export_seconds = 0;
    auto exported = [&](int layer) {
      std::vector<std::byte> payload =
          recycled_ ? sender_->take_buffer(shape_.frame_bytes) : std::vector<std::byte>(shape_.frame_bytes);
      const double export_start = thread_cpu_seconds();
      exporter.export_kv(blocks, layer, 1, dtype::f32, payload);
      if (export_seconds) *export_seconds += thread_cpu_seconds() - export_start;
      return payload;
    };
    std::vector<std::vector<std::byte>> ready_payloads;
    if (exported_before) {
      for (int layer = 0; layer < num_layers; ++layer) ready_payloads.push_back(exported(layer));
    }
    const double cpu_start = process_cpu_seconds();
    const auto start = clock_type::now();
    sender_->open(id, clock_type::now() + std::chrono::minutes(2));
    sender_->ready(id, receiver_->endpoint(), receiver_->public_key());
    for (int layer = 0; layer < num_layers; ++layer) {
      kv_frame_header h;
      h.transfer_id = id;
      h.request_id = 1;
      h.token_end = num_tokens;
      h.span = shape_.layer_span;
      h.span.first_layer = layer;
      h.payload_bytes = shape_.frame_bytes;
      std::vector<std::byte> payload = exported_before ? std::move(ready_payloads[layer]) : exported(layer);
      if (!sender_->send(h, std::move(payload))) throw std::runtime_error("the sender refused a frame");
    }
    sender_->finish(id);
    if (done.wait_for(std::chrono::minutes(2)) != std::future_status::ready || !done.get()) {
      throw std::runtime_error("a transfer did not complete");
    }
    const double seconds = std::chrono::duration<double>(clock_type::now() - start).count();
    if (cpu_seconds) *cpu_seconds = process_cpu_seconds() - cpu_start;
    return seconds;
  }

  kv_sender_stats sender_stats() const { return sender_->stats(); }

 private:
  static kv_channel_keys make_keys() {
    char public_key[41], secret_key[41];
    if (zmq_curve_keypair(public_key, secret_key) != 0) throw std::runtime_error("no CURVE in this libzmq");
    return {public_key, secret_key, {}};
  }

  transfer_shape shape_;
  bool recycled_ = true;
  std::unique_ptr<kv_receiver> receiver_;
  std::unique_ptr<kv_sender> sender_;
  std::promise<bool> done_;
  uint64_t next_id_ = 0;
};

double median_of(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

struct summary {
  double best = 0, median = 0;  // MiB/s
};

summary summarize(const std::vector<double>& seconds, size_t bytes) {
  std::vector<double> rates;
  for (double s : seconds) rates.push_back(double(bytes) / (1 << 20) / s);
  std::sort(rates.begin(), rates.end());
  return {rates.back(), rates[rates.size() / 2]};
}

std::vector<size_t> parse_sizes(const std::string& text) {
  std::vector<size_t> sizes;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) sizes.push_back(std::stoul(item));
  return sizes;
}

}  // namespace

int main(int argc, char** argv) try {
  troupe::cpu::restart_with_blas_settings(argv);  // backends/cpu/blas_core.hpp
  std::vector<size_t> sizes = {16, 64, 256};
  int reps = 5;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) throw std::runtime_error("flag " + flag + " needs a value");
    const std::string value = argv[++i];
    if (flag == "--sizes")
      sizes = parse_sizes(value);
    else if (flag == "--reps")
      reps = std::stoi(value);
    else
      throw std::runtime_error("unknown flag " + flag + " (--sizes 16,64,256 --reps 5)");
  }
  if (reps < 1) throw std::runtime_error("--reps must be at least 1");

  const model_config config = bench_config();
  const weight_store weights = make_dummy_weights(config, dtype::f32, 1);
  std::printf(
      "KV transfer on loopback: one frame per layer of a %d-layer model (%d KV heads x %d, blocks of %d, f32); "
      "MiB/s best / median of %d\n\n",
      num_layers, config.num_kv_heads, config.head_dim, block_size, reps);
  std::printf("%9s %10s | %17s | %17s | %17s %6s %6s | %17s %6s %6s | %17s %6s %6s | %17s %6s %6s | %17s %6s | %17s\n",
              "transfer", "frame", "plain TCP copy", "TCP, fresh buffers", "ZeroMQ", "median", "best", "plane over TCP",
              "median", "best", "TCP, transport", "median", "best", "TCP, alloc/frame", "median", "best",
              "ZeroMQ + CURVE", "median", "TCP + CPU import");
  std::vector<std::string> cpu_lines, pool_lines;
  for (size_t mib : sizes) {
    const transfer_shape s = shape_for(config, mib);
    transport_only_model null_pool(config, s.num_blocks);
    auto cpu_pool = make_cpu_model(config, weights, {s.num_blocks, block_size}, 1);
    auto exporter = make_cpu_model(config, weights, {s.num_blocks, block_size}, 1);  // the prefill side's pool
    {
      // Real values in every block the plane's frames are exported from (touched once, as a
      // prefill's writes would have).
      const std::vector<std::byte> values = make_payloads(s).front();
      std::vector<int32_t> all(s.num_blocks);
      std::iota(all.begin(), all.end(), 0);
      for (int layer = 0; layer < num_layers; ++layer) {
        kv_span_header span = s.layer_span;
        span.first_layer = layer;
        exporter->import_kv(all, span, values);
      }
    }
    plane zmq_plane(null_pool, s, false), curve_plane(null_pool, s, true), import_plane(*cpu_pool, s, false, true),
        tcp_plane(null_pool, s, false, true), fresh_plane(null_pool, s, false, true, false);
    plain_tcp tcp_pair(s);
    // One transfer per plane before the timed ones, as the plain copy connects beforehand: each
    // sender connects, and its pool grows to the frames the exporter runs ahead of the socket.
    for (plane* p : {&zmq_plane, &tcp_plane, &fresh_plane, &curve_plane, &import_plane}) p->run(*exporter);
    std::vector<double> tcp, tcp_fresh, zmq, kvtcp, transport, fresh, curve, imported, tcp_cpu, zmq_cpu, kvtcp_cpu,
        fresh_cpu, tcp_faults, kvtcp_faults, fresh_faults, kvtcp_export;
    for (int r = 0; r < reps; ++r) {
      const auto payloads = make_payloads(s);
      double cpu = process_cpu_seconds();
      double faults = process_minor_faults();
      tcp.push_back(tcp_pair.run(payloads));
      tcp_cpu.push_back(process_cpu_seconds() - cpu);
      tcp_faults.push_back(process_minor_faults() - faults);
      tcp_fresh.push_back(tcp_pair.run(payloads, true));
      zmq.push_back(zmq_plane.run(*exporter, &cpu));
      zmq_cpu.push_back(cpu);
      faults = process_minor_faults();
      double exported = 0;
      kvtcp.push_back(tcp_plane.run(*exporter, &cpu, &exported));
      kvtcp_cpu.push_back(cpu);
      kvtcp_export.push_back(exported);
      kvtcp_faults.push_back(process_minor_faults() - faults);
      transport.push_back(tcp_plane.run(*exporter, nullptr, nullptr, true));
      faults = process_minor_faults();
      fresh.push_back(fresh_plane.run(*exporter, &cpu));
      fresh_cpu.push_back(cpu);
      fresh_faults.push_back(process_minor_faults() - faults);
      curve.push_back(curve_plane.run(*exporter));
      imported.push_back(import_plane.run(*exporter));
    }
    const size_t bytes = s.total_bytes();
    const summary t = summarize(tcp, bytes), f = summarize(tcp_fresh, bytes), z = summarize(zmq, bytes),
                  k = summarize(kvtcp, bytes), x = summarize(transport, bytes), a = summarize(fresh, bytes),
                  c = summarize(curve, bytes), i = summarize(imported, bytes);
    std::printf(
        "%5.1f MiB %6.2f MiB | %7.0f / %7.0f | %7.0f / %7.0f | %7.0f / %7.0f %5.2fx %5.2fx | %7.0f / %7.0f %5.2fx "
        "%5.2fx | %7.0f / %7.0f %5.2fx %5.2fx | %7.0f / %7.0f %5.2fx %5.2fx | %7.0f / %7.0f %5.2fx | %7.0f / %7.0f\n",
        double(bytes) / (1 << 20), double(s.frame_bytes) / (1 << 20), t.best, t.median, f.best, f.median, z.best,
        z.median, z.median / t.median, z.best / t.best, k.best, k.median, k.median / t.median, k.best / t.best, x.best,
        x.median, x.median / t.median, x.best / t.best, a.best, a.median, a.median / t.median, a.best / t.best, c.best,
        c.median, c.median / t.median, i.best, i.median);
    cpu_lines.push_back(std::to_string(mib) + " MiB: plain TCP " + std::to_string(int(median_of(tcp_cpu) * 1e3)) +
                        " ms, ZeroMQ " + std::to_string(int(median_of(zmq_cpu) * 1e3)) + " ms, plane over TCP " +
                        std::to_string(int(median_of(kvtcp_cpu) * 1e3)) + " ms (of which the export " +
                        std::to_string(int(median_of(kvtcp_export) * 1e3)) + " ms), TCP alloc/frame " +
                        std::to_string(int(median_of(fresh_cpu) * 1e3)) + " ms");
    const kv_sender_stats pooled = tcp_plane.sender_stats();
    pool_lines.push_back(std::to_string(mib) + " MiB: " + std::to_string(pooled.num_buffers_reused) + " reused / " +
                         std::to_string(pooled.num_buffers_allocated) + " allocated, minor page faults per transfer " +
                         std::to_string(int(median_of(kvtcp_faults))) + " (plain copy " +
                         std::to_string(int(median_of(tcp_faults))) + ", alloc/frame " +
                         std::to_string(int(median_of(fresh_faults))) + "), resident " +
                         std::to_string(int(resident_mib())) + " MiB after");
    std::fflush(stdout);
  }
  std::printf("\nratios against the plain TCP copy: median / median, best / best (target >= 0.8x)\n");
  std::printf("CPU time per transfer (the process, every thread; median):");
  for (const std::string& line : cpu_lines) std::printf("  %s;", line.c_str());
  std::printf("\nplane over TCP, the sender's payload buffers (kv_sender::take_buffer):");
  for (const std::string& line : pool_lines) std::printf("  %s;", line.c_str());
  std::printf("\n");
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "troupe_bench_kv_transfer: %s\n", e.what());
  return 1;
}
