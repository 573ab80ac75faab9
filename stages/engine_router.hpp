#pragma once
// The router's work, without the actor: which engine instance (a scheduler and its worker, on
// some node) takes each request, what each request has streamed so far, and what to re-run where
// when an instance is lost.
//
// Load is judged from what the router knows first hand, with no reporting lag: the requests it
// sent to an instance that have not produced a token yet (queued prompt tokens) and those that
// have (running sequences); the instance's own report of free KV blocks, carried by each token
// batch, breaks near-ties and keeps requests off a full pool. A prompt whose first block the
// router has seen goes back to the instance that served it when that costs no more than the
// prefill it saves (prefix-cache affinity).
//
// Failover: every token the router forwards is recorded against its request, so a request whose
// instance is lost is re-run elsewhere from its prompt plus exactly those tokens
// (schedule_request::resumed_output_ids): the client's stream goes on with none lost or repeated.
// Tokens an instance sends for a request that is no longer its own are dropped.
//
// Disaggregation: an instance has a role (mixed, prefill or decode). While at least one prefill
// and one decode instance take requests, a request goes to both: a prefill instance (by its
// queued prompt tokens, with prefix affinity) computes the prompt and its first token and
// streams the KV; a decode instance (by its running sequences and free blocks) reserves blocks
// for that KV and continues once the router hands it the first token. Without such a pair a
// request goes whole to a mixed or decode instance (a decode instance then computes the prefill
// itself), or to a prefill instance when nothing else is left. When either half is lost, or the
// transfer fails, the other half is aborted and the request runs again from its prompt and the
// tokens streamed so far; a request whose transfer failed max_transfer_attempts times ends with
// the reason.
//
// A route policy (stages/route_policy.hpp, a plugin's route hook when served) may choose the
// instance that computes a request's prompt before the built-in policy does: the whole request's
// instance, or the prefill half of a pair (the decode half stays the router's choice). It sees
// the instances of the roles that may take the prompt, draining ones included (so an affinity
// policy sees its instance going), with the prefix-hit estimate of each. No opinion: the
// built-in policy decides; a failure or an invalid choice: the request is not routed and
// route_error() says why.
// Failover wait: while no instance takes requests (the last one was lost, or every one drains),
// a request — a new one, or one re-run from a lost instance — waits, bounded, for an instance to
// join (`troupe launch` restarting its node, the keeper placing it again) and is then routed
// there as a re-run (take_commands()), instead of failing at once. Past the bound it fails with
// `unavailable`; beyond max_waiting waiting requests, more are refused at once.
//
// Pair admission: a decode half reserves its blocks when its scheduler admits it, in queue
// order, while the prefill half computes at once and holds the KV on its sender until the
// reservation names the destination, within the transfer's deadline. When the decode instances
// fall behind (an open-loop load past their capacity), reservations come later and later, then
// past that deadline: the transfers fail, each failure re-runs its request, and the re-runs add
// the same work again to a side that has none to spare. A soak at 100 requests/s on a pair whose
// decode side did 96 collapsed that way, nothing completing for minutes (docs/benchmarks.md,
// "Soak"). So the router keeps, per decode instance, the requests still waiting for their
// blocks, and an instance with more than min_backlog of them whose oldest has waited longer than
// reservation_wait_bound takes no new pair; with none left (and no mixed instance to take the
// request whole) a request is refused as `overloaded`, at once, before any work is spent on it.
// Throughput stays at what the pair can do, and the excess is told so instead of timing out.

#include <chrono>
#include <cstdint>
#include <deque>
#include <initializer_list>
#include <set>
#include <utility>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <memory>

#include "stages/engine_role.hpp"
#include "stages/messages.hpp"
#include "stages/route_policy.hpp"
#include "stages/stage_clock.hpp"

namespace troupe {

// What the router asks its actor to send besides forwarded tokens (take_commands()).
struct router_commands {
  std::vector<std::pair<engine_instance_id, int64_t>> aborts;  // abort_request_msg to an instance
  std::vector<std::pair<engine_instance_id, kv_handover_msg>> handovers;
  std::vector<schedule_request> reruns;  // to route again (dispatch)
  std::vector<request_failed> failures;  // to the frontend: the request has ended
  // Requests that ended while waiting for an instance (aborted, stopped): their final deltas,
  // to the detokenizers like any instance's.
  token_batch ended;
};

// [cluster] failover_wait_ms and failover_max_waiting (see "Failover wait" above).
struct failover_wait_settings {
  std::chrono::milliseconds bound{0};  // 0: a request no instance takes fails at once
  size_t max_waiting = 1024;           // requests waiting at once; more are refused at once
};

// How long the oldest request at a decode instance may wait for its blocks before that instance
// takes no new pair (see "Pair admission" above); 0: no bound. [disaggregation]
// reservation_wait_ms, by default a third of the KV transfer's deadline. The bound is on the
// oldest's wait, and the requests admitted until it is reached still queue behind it: with
// arrivals at r times what the decode side reserves, the last one admitted waits about r times
// the bound. A third leaves room for r up to 3 before transfers expire (at 1.5 times capacity
// with half the deadline, 28 of 4,500 requests still lost their transfer).
struct pair_admission_settings {
  std::chrono::milliseconds reservation_wait_bound{0};
  // And only with more than this many waiting: a handful waiting past the bound is a slow moment
  // (a starved process on a busy machine), not a queue growing past capacity, and refusing then
  // would fail requests a moment's patience serves.
  size_t min_backlog = 16;
};

struct engine_instance_info {
  engine_instance_id id = 0;
  std::string node;  // where it runs, for logs and `troupe scale --list`
  engine_state state = engine_state::active;
  engine_role role = engine_role::mixed;
  int32_t num_requests = 0;              // routed there and not finished
  int64_t num_queued_prompt_tokens = 0;  // of those without a first token yet
  engine_load load;                      // as last reported
  std::string quantization;              // its model's ("Q4_K_M"), for `troupe scale --list`
  int32_t num_awaiting_blocks = 0;       // decode halves routed there that have not reserved yet
};

class engine_router {
 public:
  // block_size: the KV block size of every instance (prefix affinity hashes the first block).
  explicit engine_router(int block_size, failover_wait_settings wait = {}, pair_admission_settings admission = {});

  // The policy consulted before the built-in one for every route(); nullptr: none.
  void set_route_policy(std::shared_ptr<route_policy> policy) { policy_ = std::move(policy); }

  // A new instance takes requests at once: every request waiting for one comes back in
  // take_commands().reruns, oldest first, to be routed again once the caller knows the instance.
  engine_instance_id add_instance(std::string node, engine_role role = engine_role::mixed,
                                  std::string quantization = {});
  // The instance's occupancy before it has sent a token batch (its answer to a stats query).
  void set_load(engine_instance_id id, const engine_load& load);

  struct routed {
    engine_instance_id instance = 0;
    bool aborted_early = false;  // an abort overtook it: send the abort right after the request
    // Disaggregated: `instance` prefills (kv send), `decode` continues (kv receive), both under
    // `kv.transfer_id`. Send the request to both, with kv_for(role) set.
    std::optional<engine_instance_id> decode;
    uint64_t transfer_id = 0;
    uint32_t attempt = 0;  // the run it is: set schedule_request::attempt to it for both halves
  };
  // Picks an instance for a new request (or a re-run one) at `now` and records it there; nullopt
  // when no instance takes requests (none, or all draining), or when the request is refused:
  // the route policy failed it, or every decode instance is behind (pair admission).
  // route_error() then says why and route_error_code() with which code.
  std::optional<routed> route(const schedule_request& request, timestamp_ns now);
  std::optional<routed> route(const schedule_request& request) { return route(request, steady_now_ns()); }
  // Why the last route() returned nullopt: a refusal's reason, or "" when no instance takes
  // requests.
  const std::string& route_error() const { return route_error_; }
  error_code route_error_code() const { return route_error_code_; }
  // Requests refused because every decode instance was behind (pair admission), ever.
  int64_t num_overload_refusals() const { return num_overload_refusals_; }

  // A token batch from `from`: deltas of requests that are not (any more) on `from` are dropped,
  // the others recorded (tokens appended, finished ones forgotten) and returned to forward.
  token_batch on_tokens(engine_instance_id from, token_batch batch);
  // A refusal from an instance (never admitted): forget the request. False when the request is
  // not on `from` (a stale refusal): drop it.
  bool on_refusal(engine_instance_id from, const request_failed& refusal);

  // Where an abort or a stop must go; nullopt for a request not routed yet (an abort is then
  // remembered and applied when the request comes: see routed::aborted_early).
  std::optional<engine_instance_id> instance_of(int64_t request_id) const;
  // Every instance that holds a part of the request (both halves of a disaggregated request
  // until the hand-off): where an abort goes.
  std::vector<engine_instance_id> holders_of(int64_t request_id) const;

  // The decode half reserved its blocks: the prefill half whose sender must hear `ready`, or
  // nullopt when the message is stale (another transfer, or that half is gone).
  std::optional<engine_instance_id> on_kv_ready(engine_instance_id from, const kv_ready_msg& ready);
  // The decode half has the whole KV: the prefill half's loss no longer matters to it.
  void on_kv_landed(engine_instance_id from, const kv_arrival_msg& arrival);
  // The decode half dropped the request: its transfer failed. The prefill half (if it still
  // holds it) is aborted and the request re-run, or failed after max_transfer_attempts.
  void on_kv_failed(engine_instance_id from, const kv_failed_msg& failed);
  // The prefill half's sender gave the transfer up (its deadline passed, its peer refused it):
  // the decode half could only wait for its own deadline, so both halves are aborted and the
  // request re-run (or failed) as for on_kv_failed. Found by transfer id (the sender knows no
  // request); a stale one (an earlier attempt, another instance) is ignored.
  void on_kv_send_failed(engine_instance_id from, const kv_failed_msg& failed);
  router_commands take_commands() { return std::exchange(commands_, {}); }

  // Transfers tried per request before it ends with the last failure's reason.
  static constexpr int max_transfer_attempts = 3;
  void abort_unrouted(int64_t request_id);
  // Forgets a request that could not be re-run (no instance took it): the caller fails it.
  void drop(int64_t request_id);

  // An instance is gone: it is forgotten, and its unfinished requests come back, each ready to be
  // re-run elsewhere (prompt, sampling and the tokens streamed so far). Unknown ids: nothing.
  std::vector<schedule_request> remove_instance(engine_instance_id id);

  // route() found no instance for `request`: it waits (true) until an instance joins or until
  // `now` plus the bound, when expire_waiting() fails it. False when it may not wait (a bound of
  // 0, or max_waiting already wait): it is forgotten and the caller fails it at once.
  bool wait_for_instance(const schedule_request& request, timestamp_ns now);
  bool is_waiting(int64_t request_id) const;
  size_t num_waiting() const { return waiting_.size(); }
  // When the oldest waiting request's bound passes; nullopt when none waits.
  std::optional<timestamp_ns> next_wait_deadline() const;
  // The caller's one timer for expire_waiting(): the deadline to set it for, when a request waits
  // and no timer is set (deadlines grow with arrival, so the oldest is always the next due); it
  // counts as set until wait_timer_fired(). nullopt: nothing to set.
  std::optional<timestamp_ns> wait_timer_to_set();
  void wait_timer_fired() { wait_timer_set_ = false; }
  // Every waiting request whose bound passed by `now` fails (take_commands().failures).
  void expire_waiting(timestamp_ns now);
  // A waiting request ends with `reason` (a client's abort, a stop string): its final delta is in
  // take_commands().ended. False when it does not wait.
  bool end_waiting(int64_t request_id, finish_reason reason);
  // The ids of every waiting request (to abort them all).
  std::vector<int64_t> waiting_requests() const;

  // Stops new requests to the instance; its requests run to their end. False for an unknown id.
  bool drain(engine_instance_id id);
  // Drains every active instance on `node`; their ids, in id order (none: an unknown node, or one
  // whose instances all drain already).
  std::vector<engine_instance_id> drain_node(const std::string& node);
  // A draining instance with no request left: it may be stopped.
  bool drained(engine_instance_id id) const;

  // Every request on an instance, with where it is (to abort them all).
  std::vector<std::pair<int64_t, engine_instance_id>> routed_requests() const;

  std::vector<engine_instance_info> instances() const;
  size_t num_requests() const { return requests_.size(); }

 private:
  struct request_record {
    engine_instance_id instance = 0;  // whose tokens are the request's now (-1: on none)
    schedule_request request;         // as first routed: prompt, sampling, priority
    std::vector<int32_t> streamed;    // every output token forwarded so far, resumed ones included
    bool started = false;             // a token came back since it was (re-)routed
    // Disaggregated (transfer_id != 0): the prefill half, the decode half, and where it stands.
    uint64_t transfer_id = 0;
    engine_instance_id prefill = -1;
    engine_instance_id decode = -1;
    bool handed_off = false;     // the prefill half's token came: `instance` is the decode half
    bool kv_landed = false;      // the decode half has the whole KV
    bool kv_reserved = false;    // the decode half's kv_ready came
    timestamp_ns routed_at = 0;  // when the pair was chosen: its wait for the decode half's blocks
    int transfer_attempts = 0;
    int64_t charged_tokens = 0;  // the prompt and streamed tokens when it was last charged
    uint32_t attempt = 0;        // its current run: deltas of another are an earlier run's, dropped
  };
  struct instance_record {
    std::string node;
    engine_role role = engine_role::mixed;
    engine_state state = engine_state::active;
    int32_t num_requests = 0;
    int32_t num_started = 0;
    int64_t num_queued_prompt_tokens = 0;
    engine_load load;
    std::string quantization;
    // Decode halves routed here without their blocks yet, oldest first (routed_at, request id).
    std::set<std::pair<timestamp_ns, int64_t>> awaiting_blocks;
  };

  // What a request costs on an instance, in tokens of work ahead of it.
  int64_t cost(const instance_record& instance, int num_prompt_blocks) const;
  std::optional<uint64_t> first_block_hash(const std::vector<int32_t>& prompt) const;
  // The active instance of one of `roles` with the least cost, prefix affinity considered.
  // `behind`: instances left out (pair admission).
  std::optional<engine_instance_id> pick(std::initializer_list<engine_role> roles, const schedule_request& request,
                                         int num_blocks, bool use_prefix_affinity,
                                         const std::vector<engine_instance_id>& behind = {});
  // The active decode instances whose oldest request waiting for its blocks has waited past the
  // bound at `now`, and how long the least behind of them has.
  std::vector<engine_instance_id> decode_instances_behind(timestamp_ns now, duration_ns& least_wait) const;
  bool any_active(std::initializer_list<engine_role> roles) const;
  // The route policy's choice among the instances of `roles`: nullopt for no opinion; throws
  // std::runtime_error with the message the request fails with.
  std::optional<engine_instance_id> ask_policy(std::initializer_list<engine_role> roles,
                                               const schedule_request& request);
  // The instance that computes the prompt's first block from now on (prefix affinity).
  void note_prefix_owner(const schedule_request& request, engine_instance_id id);
  // What a request charges an instance, and undoing it (a record charges at most two).
  void charge(request_record& record);
  void uncharge(request_record& record);
  // The decode half's kv_ready came, or the attempt ended: it no longer waits for its blocks. The
  // wait outlives the hand-off: under load the prefill half's first token comes first.
  void stop_awaiting_blocks(request_record& record);
  // Aborts every half of the request except on `except`, and queues its re-run.
  void run_again(std::unordered_map<int64_t, request_record>::iterator it, engine_instance_id except);
  // A failed transfer's request runs again (except on `except`, which dropped it already), or
  // after max_transfer_attempts ends with `why`.
  void transfer_failed(std::unordered_map<int64_t, request_record>::iterator it, engine_instance_id except,
                       const std::string& why);
  void forget(std::unordered_map<int64_t, request_record>::iterator it);

  int block_size_;
  std::shared_ptr<route_policy> policy_;
  std::string route_error_;
  error_code route_error_code_ = error_code::internal;
  int64_t num_overload_refusals_ = 0;
  failover_wait_settings wait_;
  pair_admission_settings admission_;
  struct waiting_request {
    schedule_request request;  // as route() would take it (a re-run's streamed tokens included)
    timestamp_ns deadline = 0;
  };
  // In arrival order, so also in deadline order (one bound for all).
  std::deque<waiting_request> waiting_;
  bool wait_timer_set_ = false;
  engine_instance_id next_id_ = 0;
  uint64_t next_tie_break_ = 0;
  uint64_t next_transfer_id_;
  router_commands commands_;
  std::unordered_map<engine_instance_id, instance_record> instances_;
  std::unordered_map<int64_t, request_record> requests_;
  // First prompt block → the instance that last prefilled it; bounded (cleared when full).
  std::unordered_map<uint64_t, engine_instance_id> prefix_owner_;
  // Aborts that overtook their request (still being tokenized); bounded, oldest dropped.
  std::unordered_set<int64_t> early_aborts_;
  std::deque<int64_t> early_abort_order_;
};

}  // namespace troupe
