#include "pipeline/stage_link.hpp"

#include <unistd.h>

#include <array>
#include <stdexcept>

#include "kvtransfer/kv_tcp.hpp"

namespace troupe {

namespace {

// Reads one frame's header (refusing what `limits` do not allow); why not, or "".
std::string read_header(int fd, const stage_frame_limits& limits, std::chrono::steady_clock::time_point deadline,
                        stage_frame_header& header) {
  std::array<std::byte, stage_frame_header_bytes> head{};
  std::string why;
  if (!kv_tcp_read_exact(fd, head, deadline, why)) return why;
  try {
    header = decode_stage_frame_header(head, limits);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

// A failure frame's text (the header read); why it could not be read otherwise.
std::string read_failure(int fd, const stage_frame_header& header, std::chrono::steady_clock::time_point deadline) {
  std::string text(header.payload_bytes, '\0');
  std::string why;
  if (!kv_tcp_read_exact(fd, std::as_writable_bytes(std::span(text.data(), text.size())), deadline, why)) return why;
  return text;
}

}  // namespace

stage_link::stage_link(std::string endpoint, layer_range layers, const stage_hello& expected,
                       std::chrono::milliseconds connect_timeout, std::chrono::milliseconds step_timeout)
    : endpoint_(std::move(endpoint)), layers_(layers), hidden_size_(expected.hidden_size), step_timeout_(step_timeout) {
  auto fail = [&](const std::string& why) -> std::runtime_error {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    return std::runtime_error("pipeline stage " + layer_range_text(layers_) + " at " + endpoint_ + ": " + why);
  };
  std::string why;
  fd_ = kv_tcp_connect(endpoint_, connect_timeout, step_timeout_, why);
  if (fd_ < 0) throw fail(why);
  kv_tcp_prepare_accepted(fd_, step_timeout_);  // reads wait at most the step timeout
  stage_frame_header hello;
  hello.kind = stage_frame_kind::hello;
  hello.payload_bytes = stage_hello_bytes;
  std::array<std::byte, stage_frame_header_bytes> head{};
  encode_stage_frame_header(hello, head);
  const auto deadline = std::chrono::steady_clock::now() + connect_timeout;
  if (kv_tcp_write_frame(fd_, head, encode_stage_hello(expected), deadline, why) != kv_tcp_write::done) {
    throw fail(why.empty() ? "the stage took no hello" : why);
  }
  stage_frame_limits limits;
  limits.hidden_size = hidden_size_;
  stage_frame_header answer;
  if (why = read_header(fd_, limits, deadline, answer); !why.empty()) throw fail(why);
  if (answer.kind == stage_frame_kind::failure) throw fail(read_failure(fd_, answer, deadline));
  if (answer.kind != stage_frame_kind::hello_ack) throw fail("the stage answered the hello with another frame");
  std::vector<std::byte> payload(answer.payload_bytes);
  if (!kv_tcp_read_exact(fd_, payload, deadline, why)) throw fail(why);
  const stage_hello held = decode_stage_hello(payload);
  if (held.first_layer != layers_.first || held.end_layer != layers_.end) {
    throw fail("the stage holds layers " + layer_range_text({held.first_layer, held.end_layer}));
  }
  num_blocks_ = held.num_blocks;
  thread_ = std::thread([this] { run(); });
}

stage_link::~stage_link() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (fd_ >= 0) ::close(fd_);
}

void stage_link::push(micro_batch_job* job) {
  {
    std::lock_guard lock(mutex_);
    queue_.push_back(job);
  }
  wake_.notify_one();
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
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left to hand on
      job = queue_.front();
      queue_.pop_front();
      down = broken_;
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
  std::string why;
  const std::span<const std::byte> residual =
      first ? std::span<const std::byte>{} : std::as_bytes(std::span(job.stream[0]));
  const kv_tcp_write written = kv_tcp_write_frame(fd_, head_, residual, deadline, why);
  auto break_link = [&](std::string reason) {
    std::lock_guard lock(mutex_);
    broken_ = "pipeline stage " + layer_range_text(layers_) + " at " + endpoint_ + ": " + reason;
    return reason;
  };
  if (written != kv_tcp_write::done) return break_link(why.empty() ? "the stage took no frame in time" : why);
  stage_frame_limits limits;
  limits.hidden_size = hidden_size_;
  limits.max_tokens = job.batch->num_tokens();
  stage_frame_header answer;
  if (why = read_header(fd_, limits, deadline, answer); !why.empty()) return break_link(why);
  if (answer.kind == stage_frame_kind::failure) {
    std::string text = read_failure(fd_, answer, deadline);
    return text;  // the stage read the whole frame and refused it: the link stays in step
  }
  if (answer.kind != stage_frame_kind::result || answer.step_id != job.step_id || answer.micro_batch != job.index ||
      answer.num_tokens != job.batch->num_tokens()) {
    return break_link("the stage answered step " + std::to_string(answer.step_id) + " micro-batch " +
                      std::to_string(answer.micro_batch) + " for step " + std::to_string(job.step_id) +
                      " micro-batch " + std::to_string(job.index));
  }
  job.stream[1].resize(static_cast<size_t>(answer.num_tokens) * static_cast<size_t>(hidden_size_));
  if (!kv_tcp_read_exact(fd_, std::as_writable_bytes(std::span(job.stream[1])), deadline, why)) return break_link(why);
  return "";
}

}  // namespace troupe
