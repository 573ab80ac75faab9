#pragma once
// The typed interfaces of the stage actors (CAF's typed_actor): what each stage receives and what
// it answers. A handle of one of these types lets a sender send only what the stage handles (a
// compile error otherwise), and a behaviour written for it must handle exactly those messages.
// Spawned remotely, a stage is asked for by its interface: CAF refuses a remote spawn whose actor
// has another one. docs/architecture.md ("Messages") says what each message carries;
// tests/stages/stage_interfaces_test.cpp checks that table against these lists.
//
// The messages themselves are stages/messages.hpp; the atoms that name requests without a
// struct of their own are here, beside the interface that takes them.

#include <caf/atom.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "engine/engine_config.hpp"
#include "stages/engine_role.hpp"
#include "stages/detokenizer_resume.hpp"
#include "stages/messages.hpp"
#include "stages/trace_messages.hpp"

namespace troupe {

// (loaded_atom) → true: the stage's tokenizer loaded (a refused placement answers with the
// error). The controller asks every tokenizer and detokenizer it places (node/node.cpp).
using loaded_atom = caf::atom_constant<caf::atom("loaded")>;

// Turns requests into tokens: a checked request goes to the router (schedule_request), a refused
// one to the frontend (request_failed).
using tokenizer_handle = caf::typed_actor<caf::reacts_to<tokenize_request>,          //
                                          caf::replies_to<loaded_atom>::with<bool>,  //
                                          caf::reacts_to<stage_failure_drill>>;

// Turns a request's tokens into text: text batches and failures go to the frontend, and a stop
// string met goes back to the scheduler that sent the batch (stop_request_msg). A
// detokenizer_resume_msg, from the router, comes before the deltas of a request it takes over
// from a lost detokenizer.
using detokenizer_handle = caf::typed_actor<caf::reacts_to<token_batch>,               //
                                            caf::reacts_to<detokenizer_resume_msg>,    //
                                            caf::replies_to<loaded_atom>::with<bool>,  //
                                            caf::reacts_to<stage_failure_drill>>;

// (kv_leases_atom) → kv_lease_counts: the transfers a KV agent's connector holds.
using kv_leases_atom = caf::atom_constant<caf::atom("kvleases")>;

// The KV agent beside a worker (stages/stage_actors.hpp): reservations from its scheduler
// (kv_expect_msg → kv_ready_msg, kv_cancel_msg), destinations from the router (kv_ready_msg), and
// its connector's completions (kv_arrival_msg, to the reserving scheduler) and failures
// (kv_failed_msg, to the router), which arrive from the transport's threads.
using kv_agent_handle = caf::typed_actor<caf::replies_to<kv_expect_msg>::with<kv_ready_msg>,  //
                                         caf::reacts_to<kv_cancel_msg>,                       //
                                         caf::reacts_to<kv_ready_msg>,                        //
                                         caf::reacts_to<kv_arrival_msg>,                      //
                                         caf::reacts_to<kv_failed_msg>,                       //
                                         caf::replies_to<kv_leases_atom>::with<kv_lease_counts>>;

// What a worker tells the controller about the model it loaded, on a describe request: the
// scheduler of its instance must plan for exactly its KV pool, and the doors check prompts
// against its limits.
struct worker_description {
  engine_config config;  // block_size, num_kv_blocks, max_model_len, vocab_size of the loaded model
  std::vector<int32_t> eos_token_ids;
  std::string summary;       // describe(served_model), for the controller's log
  std::string quantization;  // loaded_model::quantization ("Q4_K_M"), for /v1/models and `troupe scale --list`
  kv_agent_handle kv_agent;  // the worker's KV agent: its scheduler talks to it
};

// (describe_atom) → worker_description: what a worker loaded.
using describe_atom = caf::atom_constant<caf::atom("describe")>;
// (engine_instance_atom, id), from the router to a joined instance's scheduler and worker: the id
// they are known by, which `troupe inspect` and /metrics then show beside their actor ids.
using engine_instance_atom = caf::atom_constant<caf::atom("enginst")>;

// Owns an engine instance's model and runs its steps: a step_plan from its scheduler is answered
// with the step's result when computed (the worker blocks meanwhile, on its own thread).
using worker_handle = caf::typed_actor<caf::replies_to<step_plan>::with<step_done>,               //
                                       caf::replies_to<describe_atom>::with<worker_description>,  //
                                       caf::reacts_to<engine_instance_atom, int32_t>,             //
                                       caf::reacts_to<stage_failure_drill>>;

// (pipeline_tick_atom), a scheduler to itself: look again at requests waiting for a lost pipeline
// stage.
using pipeline_tick_atom = caf::atom_constant<caf::atom("pipetick")>;

// Owns an engine instance's scheduler (stages/scheduler_stage.hpp): requests from the router and
// what happens to them (aborts, stops, a disaggregated request's KV landing or handed over), the
// statistics and trace queries the router fans out, and its own pipeline tick. Steps go to its
// worker; token batches, refusals and the KV plane's news to the router.
using scheduler_handle = caf::typed_actor<caf::reacts_to<schedule_request>,                  //
                                          caf::reacts_to<abort_request_msg>,                 //
                                          caf::reacts_to<stop_request_msg>,                  //
                                          caf::reacts_to<kv_arrival_msg>,                    //
                                          caf::reacts_to<kv_handover_msg>,                   //
                                          caf::replies_to<stats_query>::with<stats_answer>,  //
                                          caf::replies_to<trace_query>::with<trace_answer>,  //
                                          caf::reacts_to<pipeline_tick_atom>,                //
                                          caf::reacts_to<engine_instance_atom, int32_t>,     //
                                          caf::reacts_to<stage_failure_drill>>;

// -- the router (stages/engine_router.hpp), always on the controller ---------------------------
// The controller adds engine instances with (engine_joined_atom, scheduler, worker, node name,
// KV agent, role name, quantization) → engine_instance_id (role: "mixed", "prefill" or
// "decode"), drains one with (drain_engine_atom, id) → bool and lists them with
// (list_engines_atom) → lines of text. (drain_node_atom, node name, int32_t deadline_ms) →
// std::vector<int32_t> drains every active instance on a node (their ids); past the deadline
// (if > 0) an instance still busy is taken out and its requests re-run elsewhere, each stream
// going on where it was.
using engine_joined_atom = caf::atom_constant<caf::atom("engjoin")>;
using drain_engine_atom = caf::atom_constant<caf::atom("engdrain")>;
using drain_node_atom = caf::atom_constant<caf::atom("nodedrain")>;
using list_engines_atom = caf::atom_constant<caf::atom("englist")>;
// (set_detokenizers_atom, std::vector<detokenizer_handle>): the detokenizers from now on (one was
// replaced); (abort_all_atom): abort every request on an instance (the node failed them all).
// A detokenizer that replaces a lost one (an actor other than the one at its index) takes over
// its requests mid-stream: the router asks the frontend (delivered_tokens_atom, ids) →
// std::vector<int32_t> how many output tokens each client has, holds that detokenizer's deltas
// meanwhile, and sends it what stages/detokenizer_ledger.hpp says.
using set_detokenizers_atom = caf::atom_constant<caf::atom("setdetok")>;
using abort_all_atom = caf::atom_constant<caf::atom("abortall")>;
using delivered_tokens_atom = caf::atom_constant<caf::atom("delivtok")>;
// (retokenize_atom): a tokenizer was lost; the router calls router_spec::on_tokenizer_lost once
// every request that tokenizer had already passed on (ahead in the router's mailbox) is routed.
using retokenize_atom = caf::atom_constant<caf::atom("retoken")>;
// The router's own timers: the oldest request waiting for an instance may have reached its bound
// (failover_wait_atom); a node drain's deadline for one of its instances (drain_deadline_atom, id).
using failover_wait_atom = caf::atom_constant<caf::atom("fowait")>;
using drain_deadline_atom = caf::atom_constant<caf::atom("draindue")>;

// Everything a request meets between its tokenizer and its detokenizer goes through the router:
// requests, token batches, refusals, stops and aborts, the statistics and trace queries it fans
// out to the schedulers, a disaggregated request's KV news, and the controller's commands.
using router_handle =
    caf::typed_actor<caf::replies_to<engine_joined_atom, scheduler_handle, worker_handle, std::string, kv_agent_handle,
                                     std::string, std::string>::with<engine_instance_id>,
                     caf::replies_to<drain_engine_atom, engine_instance_id>::with<bool>,
                     caf::replies_to<drain_node_atom, std::string, int32_t>::with<std::vector<int32_t>>,
                     caf::replies_to<list_engines_atom>::with<std::vector<std::string>>,
                     caf::reacts_to<set_detokenizers_atom, std::vector<detokenizer_handle>>,  //
                     caf::reacts_to<retokenize_atom>,                                         //
                     caf::reacts_to<abort_all_atom>,                                          //
                     caf::reacts_to<failover_wait_atom>,                                      //
                     caf::reacts_to<drain_deadline_atom, engine_instance_id>,                 //
                     caf::reacts_to<schedule_request>,                                        //
                     caf::reacts_to<token_batch>,                                             //
                     caf::reacts_to<request_failed>,                                          //
                     caf::reacts_to<stop_request_msg>,                                        //
                     caf::reacts_to<abort_request_msg>,                                       //
                     caf::reacts_to<stats_query>,                                             //
                     caf::reacts_to<trace_query>,                                             //
                     caf::reacts_to<kv_ready_msg>,                                            //
                     caf::reacts_to<kv_arrival_msg>,                                          //
                     caf::reacts_to<kv_failed_msg>,                                           //
                     caf::reacts_to<stage_failure_drill>>;

// The doors' one actor (doors/door_actor.hpp): every reply to a client comes here, and it
// answers the router's (delivered_tokens_atom, ids) with the output tokens each client has.
using frontend_handle =
    caf::typed_actor<caf::reacts_to<text_batch>,      //
                     caf::reacts_to<request_failed>,  //
                     caf::reacts_to<stats_answer>,    //
                     caf::reacts_to<trace_answer>,    //
                     caf::replies_to<delivered_tokens_atom, std::vector<int64_t>>::with<std::vector<int32_t>>>;

}  // namespace troupe
