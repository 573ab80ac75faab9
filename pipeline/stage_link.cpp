#include "pipeline/stage_link.hpp"

#include <algorithm>
#include <array>
#include <stdexcept>

#include "kvtransfer/kv_tcp.hpp"
#include "pipeline/stage_pair_frames.hpp"

namespace troupe {

namespace {

// Reads one frame's header (refusing what `limits` do not allow); why not, or "".
std::string read_header(stage_channel& channel, const stage_frame_limits& limits,
                        std::chrono::steady_clock::time_point deadline, stage_frame_header& header) {
  std::array<std::byte, stage_frame_header_bytes> head{};
  if (std::string why = channel.read_header(head, deadline); !why.empty()) return why;
  try {
    header = decode_stage_frame_header(head, limits);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

// A failure frame's text (the header read); why it could not be read otherwise.
std::string read_failure(stage_channel& channel, const stage_frame_header& header,
                         std::chrono::steady_clock::time_point deadline) {
  std::string text(header.payload_bytes, '\0');
  const std::string why = channel.read(std::as_writable_bytes(std::span(text.data(), text.size())), deadline);
  return why.empty() ? text : why;
}

}  // namespace

stage_link::stage_link(std::string endpoint, layer_range layers, const stage_hello& expected,
                       std::chrono::milliseconds connect_timeout, std::chrono::milliseconds step_timeout,
                       const kv_channel_keys& keys)
    : endpoint_(std::move(endpoint)), layers_(layers), hidden_size_(expected.hidden_size), step_timeout_(step_timeout) {
  auto fail = [&](const std::string& why) -> std::runtime_error {
    channel_.reset();
    return std::runtime_error("pipeline stage " + layer_range_text(layers_) + " at " + endpoint_ + ": " + why);
  };
  stage_frame_limits limits;
  limits.hidden_size = hidden_size_;
  const bool curve = is_curve_stage_endpoint(endpoint_);
  if (curve) {
    if (keys.empty()) throw fail("a curve:// stage needs the cluster's credentials ([cluster] credentials)");
    channel_ = curve_stage_client(endpoint_, keys, stage_max_frame_bytes(limits));
  } else {
    std::string why;
    const int fd = kv_tcp_connect(endpoint_, connect_timeout, step_timeout_, why);
    if (fd < 0) throw fail(why);
    kv_tcp_prepare_accepted(fd, step_timeout_);  // reads wait at most the step timeout
    channel_ = tcp_stage_channel(fd);
  }
  stage_frame_header hello;
  hello.kind = stage_frame_kind::hello;
  hello.payload_bytes = stage_hello_bytes;
  std::array<std::byte, stage_frame_header_bytes> head{};
  encode_stage_frame_header(hello, head);
  const auto deadline = std::chrono::steady_clock::now() + connect_timeout;
  if (std::string why = channel_->write(head, encode_stage_hello(expected), deadline); !why.empty()) throw fail(why);
  stage_frame_header answer;
  if (std::string why = read_header(*channel_, limits, deadline, answer); !why.empty()) {
    // CURVE says nothing to a client it refuses: the handshake just never completes.
    throw fail(why + (curve ? " (is it listening, with this cluster's keys, and is KEY its public key?)" : ""));
  }
  if (answer.kind == stage_frame_kind::failure) throw fail(read_failure(*channel_, answer, deadline));
  if (answer.kind != stage_frame_kind::hello_ack) throw fail("the stage answered the hello with another frame");
  std::vector<std::byte> payload(answer.payload_bytes);
  if (std::string why = channel_->read(payload, deadline); !why.empty()) throw fail(why);
  const stage_hello held = decode_stage_hello(payload);
  if (held.first_layer != layers_.first || held.end_layer != layers_.end) {
    throw fail("the stage holds layers " + layer_range_text({held.first_layer, held.end_layer}));
  }
  num_blocks_ = held.num_blocks;
  num_model_layers_ = held.num_layers;
  // What the connection's set-up went through (a first attempt closed while the stage started)
  // is not the stage going away: only what happens from here on counts.
  (void)channel_->peer_gone();
  thread_ = std::thread([this] { run(); });
}

stage_link::~stage_link() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void stage_link::push(micro_batch_job* job) {
  {
    std::lock_guard lock(mutex_);
    queue_.push_back({job, nullptr});
  }
  wake_.notify_one();
}

std::string stage_link::export_kv(std::span<const int32_t> block_ids, const kv_span_header& span,
                                  std::span<std::byte> out) {
  kv_job job{stage_frame_kind::kv_export, block_ids, span, out, {}};
  return run_kv_job(job);
}

std::string stage_link::import_kv(std::span<const int32_t> block_ids, const kv_span_header& span,
                                  std::span<const std::byte> data) {
  kv_job job{stage_frame_kind::kv_import, block_ids, span, {}, data};
  return run_kv_job(job);
}

std::string stage_link::lease_kv(const kv_stage_lease& lease, kv_stage_route& route) {
  kv_job job;
  job.kind = stage_frame_kind::kv_lease;
  job.lease = &lease;
  job.route = &route;
  return run_kv_job(job);
}

std::string stage_link::release_kv(uint64_t transfer_id) {
  kv_job job;
  job.kind = stage_frame_kind::kv_release;
  job.release = transfer_id;
  return run_kv_job(job);
}

void stage_link::queue_push_kv(kv_stage_push push) {
  auto owned = std::make_unique<owned_push>();
  owned->push = std::move(push);
  owned->job.kind = stage_frame_kind::kv_push;
  owned->job.push = &owned->push;
  {
    std::lock_guard lock(mutex_);
    if (stopping_) {
      owned->job.failure = "pipeline stage " + layer_range_text(layers_) + " at " + endpoint_ + ": the link is closing";
      owned->job.done = true;
    } else {
      queue_.push_back({nullptr, &owned->job});
    }
    pushes_.push_back(std::move(owned));
  }
  wake_.notify_one();
}

std::string stage_link::wait_pushes() {
  std::unique_lock lock(mutex_);
  kv_done_.wait(lock,
                [&] { return std::all_of(pushes_.begin(), pushes_.end(), [](const auto& p) { return p->job.done; }); });
  std::string failure;
  for (const auto& p : pushes_) {
    if (failure.empty()) failure = p->job.failure;
  }
  pushes_.clear();
  return failure;
}

std::string stage_link::run_kv_job(kv_job& job) {
  std::unique_lock lock(mutex_);
  if (stopping_) return "pipeline stage " + layer_range_text(layers_) + " at " + endpoint_ + ": the link is closing";
  queue_.push_back({nullptr, &job});
  wake_.notify_one();
  kv_done_.wait(lock, [&] { return job.done; });
  return job.failure;
}

std::string stage_link::broken() const {
  std::lock_guard lock(mutex_);
  return broken_;
}

void stage_link::run() {
  for (;;) {
    micro_batch_job* job = nullptr;
    std::string down;
    {
      std::unique_lock lock(mutex_);
      // A broken link lets go of its connection at once, so the stage's end is not left
      // half-closed, holding its port against the stage restarted on it.
      if (!broken_.empty()) channel_.reset();
      if (!wake_.wait_for(lock, idle_probe_interval, [&] { return stopping_ || !queue_.empty(); })) {
        // Idle: a stage that died now is noticed now (on the health board, and reconnected), not
        // at the next step, which would fail for it.
        if (broken_.empty()) {
          lock.unlock();
          const std::string why = channel_->peer_gone();
          lock.lock();
          if (!why.empty() && broken_.empty()) {
            broken_ = "pipeline stage " + layer_range_text(layers_) + " at " + endpoint_ + ": " + why;
          }
        }
        continue;
      }
      if (queue_.empty()) return;  // stopping, nothing left to hand on
      const queued next = queue_.front();
      queue_.pop_front();
      down = broken_;
      if (next.kv != nullptr) {
        kv_job& kv = *next.kv;
        lock.unlock();
        std::string why = down;
        if (why.empty()) {
          why = exchange(kv);
          if (!why.empty()) why = "pipeline stage " + layer_range_text(layers_) + " at " + endpoint_ + ": " + why;
        }
        lock.lock();
        kv.failure = std::move(why);
        kv.done = true;
        kv_done_.notify_all();
        continue;
      }
      job = next.micro_batch;
    }
    if (job->failure.empty()) {
      if (!down.empty()) {
        job->failure = down;
      } else if (std::string why = exchange(*job); !why.empty()) {
        job->failure = "pipeline stage " + layer_range_text(layers_) + " at " + endpoint_ + ": " + why;
      } else {
        std::swap(job->stream[0], job->stream[1]);
      }
    }
    next_(job);
  }
}

std::string stage_link::exchange(micro_batch_job& job) {
  const bool first = layers_.holds_embedding();
  const int32_t sent_width = first ? 0 : hidden_size_;
  encode_work_frame(job.step_id, job.index, *job.batch, sent_width, head_);
  const auto deadline = std::chrono::steady_clock::now() + step_timeout_;
  const std::span<const std::byte> residual =
      first ? std::span<const std::byte>{} : std::as_bytes(std::span(job.stream[0]));
  auto break_link = [&](std::string reason) {
    std::lock_guard lock(mutex_);
    broken_ = "pipeline stage " + layer_range_text(layers_) + " at " + endpoint_ + ": " + reason;
    return reason;
  };
  if (std::string why = channel_->write(head_, residual, deadline); !why.empty()) return break_link(why);
  stage_frame_limits limits;
  limits.hidden_size = hidden_size_;
  limits.max_tokens = job.batch->num_tokens();
  stage_frame_header answer;
  if (std::string why = read_header(*channel_, limits, deadline, answer); !why.empty()) return break_link(why);
  if (answer.kind == stage_frame_kind::failure) {
    return read_failure(*channel_, answer, deadline);  // the stage read the whole frame and refused it: still in step
  }
  if (answer.kind != stage_frame_kind::result || answer.step_id != job.step_id || answer.micro_batch != job.index ||
      answer.num_tokens != job.batch->num_tokens()) {
    return break_link("the stage answered step " + std::to_string(answer.step_id) + " micro-batch " +
                      std::to_string(answer.micro_batch) + " for step " + std::to_string(job.step_id) +
                      " micro-batch " + std::to_string(job.index));
  }
  busy_ns_ += uint64_t{answer.compute_us} * 1000;
  {
    std::lock_guard lock(mutex_);
    stage_cpu_ = process_cpu{answer.process_id, answer.process_cpu_us, answer.compute_cpu_us};
  }
  job.stream[1].resize(static_cast<size_t>(answer.num_tokens) * static_cast<size_t>(hidden_size_));
  if (std::string why = channel_->read(std::as_writable_bytes(std::span(job.stream[1])), deadline); !why.empty()) {
    return break_link(why);
  }
  return "";
}

std::string stage_link::exchange_pair(kv_job& job) {
  const uint64_t id = ++kv_exchanges_;
  if (job.kind == stage_frame_kind::kv_lease) {
    encode_stage_kv_lease(id, *job.lease, num_model_layers_, head_);
  } else if (job.kind == stage_frame_kind::kv_push) {
    encode_stage_kv_push(id, *job.push, head_);
  } else {
    encode_stage_kv_release(id, job.release, head_);
  }
  const auto deadline = std::chrono::steady_clock::now() + step_timeout_;
  auto break_link = [&](std::string reason) {
    std::lock_guard lock(mutex_);
    broken_ = "pipeline stage " + layer_range_text(layers_) + " at " + endpoint_ + ": " + reason;
    return reason;
  };
  if (std::string why = channel_->write(head_, {}, deadline); !why.empty()) return break_link(why);
  stage_frame_limits limits;
  limits.hidden_size = hidden_size_;
  stage_frame_header answer;
  if (std::string why = read_header(*channel_, limits, deadline, answer); !why.empty()) return break_link(why);
  if (answer.kind == stage_frame_kind::failure) return read_failure(*channel_, answer, deadline);
  const bool leasing = job.kind == stage_frame_kind::kv_lease;
  const stage_frame_kind expected = leasing ? stage_frame_kind::kv_lease_ack : stage_frame_kind::kv_done;
  if (answer.kind != expected || answer.step_id != id) {
    return break_link("the stage answered KV pair exchange " + std::to_string(id) + " with another frame (for " +
                      std::to_string(answer.step_id) + ")");
  }
  if (!leasing) return "";
  std::vector<std::byte> text(answer.payload_bytes);  // bounded by stage_route_max_bytes
  if (std::string why = channel_->read(text, deadline); !why.empty()) return break_link(why);
  try {
    *job.route = decode_route_text(text);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  if (job.route->layers != layers_) {
    return "the stage's KV receiver says it holds layers " + layer_range_text(job.route->layers) + ", not " +
           layer_range_text(layers_);
  }
  return "";
}

std::string stage_link::exchange(kv_job& job) {
  if (job.kind != stage_frame_kind::kv_export && job.kind != stage_frame_kind::kv_import) return exchange_pair(job);
  const bool exporting = job.kind == stage_frame_kind::kv_export;
  const uint64_t id = ++kv_exchanges_;
  encode_kv_request(job.kind, id, job.span, job.block_ids, exporting ? 0 : job.data.size(), head_);
  const auto deadline = std::chrono::steady_clock::now() + step_timeout_;
  auto break_link = [&](std::string reason) {
    std::lock_guard lock(mutex_);
    broken_ = "pipeline stage " + layer_range_text(layers_) + " at " + endpoint_ + ": " + reason;
    return reason;
  };
  if (std::string why = channel_->write(head_, exporting ? std::span<const std::byte>{} : job.data, deadline);
      !why.empty()) {
    return break_link(why);
  }
  stage_frame_limits limits;
  limits.hidden_size = hidden_size_;
  limits.max_kv_bytes = exporting ? job.out.size() : 0;
  stage_frame_header answer;
  if (std::string why = read_header(*channel_, limits, deadline, answer); !why.empty()) return break_link(why);
  if (answer.kind == stage_frame_kind::failure) {
    return read_failure(*channel_, answer, deadline);  // refused whole: still in step
  }
  const stage_frame_kind expected = exporting ? stage_frame_kind::kv_data : stage_frame_kind::kv_done;
  if (answer.kind != expected || answer.step_id != id || (exporting && answer.payload_bytes != job.out.size())) {
    return break_link("the stage answered KV " + std::string(exporting ? "export " : "import ") + std::to_string(id) +
                      " with another frame (" + std::to_string(answer.payload_bytes) + " bytes for exchange " +
                      std::to_string(answer.step_id) + ")");
  }
  if (exporting) {
    if (std::string why = channel_->read(job.out, deadline); !why.empty()) return break_link(why);
  }
  return "";
}

stage_link::process_cpu stage_link::stage_process_cpu() const {
  std::lock_guard lock(mutex_);
  return stage_cpu_;
}

}  // namespace troupe
