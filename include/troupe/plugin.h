/* Troupe's plugin ABI: a shared library that adds its own stage logic to a served model.
 *
 * C only (C99 and C++ compile it alike), so a plugin may be written in any language with a C
 * FFI and built with any compiler. The library exports one function, troupe_plugin_init, which
 * fills a troupe_plugin: the version it was built against, an opaque state pointer, and the hooks
 * it implements (NULL: not implemented). The host (troupe serve) calls the hooks on its stages:
 *
 *   request  in the tokenizer stage, after tokenization, before routing: accept, reject with a
 *            message (the client gets an error naming the plugin), or rewrite the prompt's ids or
 *            the sampling parameters;
 *   output   in the detokenizer stage, once per detokenized delta of a request: pass, rewrite the
 *            delta's text (holding some back for the next delta is a rewrite), or stop the request
 *            with a reason;
 *   logits   (ABI 1.1) in the worker, once per step for each request that names the plugin in its
 *            `plugins` field, on the request's row of logits just before sampling: change any
 *            logit in place, or mask a token by setting its logit to -INFINITY. On the CPU backend
 *            the row is the sampler's own; on CUDA the hook is host-side: a step with such a
 *            request copies its logits rows to host memory (4 bytes x vocabulary per row) and is
 *            sampled on the host instead of the device.
 *   route    (ABI 1.2) in the router, once each time a request is dispatched to an engine instance
 *            (a re-run after its instance was lost is dispatched again): choose the instance among
 *            the candidates, given their loads and the router's prefix-hit estimates, or give no
 *            opinion (the router's own policy decides).
 *
 * Versions are negotiated both ways: the host passes its own version to troupe_plugin_init (a
 * plugin may refuse a host too old for it), and the plugin writes the version it was built
 * against into troupe_plugin; the host refuses a different major, or a minor above its own.
 *
 * Memory: every pointer the host passes is owned by the host and valid only during the call.
 * Everything a plugin hands back goes through its troupe_reply's functions, which copy: the
 * plugin keeps ownership of its own buffers. `name` must stay valid until destroy.
 *
 * Threads: the host may call one plugin instance's hooks from several threads at once (a pool of
 * tokenizers shares one instance); calls for one request come one at a time, in order. A plugin
 * guards its own state. Each stage that runs a plugin's hooks has its own instance (its own
 * troupe_plugin_init), since stages may run on different nodes.
 *
 * Time: each call has a budget (default 50 ms, per plugin); a call that returns after it fails
 * its request, which is reported. A hook is never interrupted: keep hooks short and non-blocking.
 * Errors: a hook returns TROUPE_PLUGIN_ERROR (with a message through reply->set_message) to fail
 * only the request it was called for; the server goes on serving. C++ plugins must not let an
 * exception cross this ABI (troupe/plugin.hpp's wrapper turns them into errors). */
#ifndef TROUPE_PLUGIN_H
#define TROUPE_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TROUPE_PLUGIN_ABI_MAJOR 1u
#define TROUPE_PLUGIN_ABI_MINOR 2u

/* What a hook decided. */
typedef enum troupe_plugin_status {
  TROUPE_PLUGIN_OK = 0,     /* go on (with whatever the plugin rewrote through its reply) */
  TROUPE_PLUGIN_REJECT = 1, /* request hook: refuse the request; the message tells the client why */
  TROUPE_PLUGIN_STOP = 2,   /* output hook: end the request now (finish "stop"); the message is the reason */
  TROUPE_PLUGIN_ERROR = 3   /* the plugin failed: only this request fails, with the message */
} troupe_plugin_status;

/* The sampling parameters a request hook may read and change in place (the host checks them
 * again after the hook, as it checks a client's). */
typedef struct troupe_sampling {
  double temperature; /* 0: greedy */
  double top_p;       /* 1: off */
  double min_p;       /* 0: off */
  int32_t top_k;      /* 0: off */
  int32_t max_tokens; /* output tokens at most */
  double presence_penalty;
  double frequency_penalty;
  double repetition_penalty;
  int64_t seed; /* -1: none; else 0 to 2^63 - 1 */
} troupe_sampling;

/* A request as the request hook sees it. Strings are UTF-8 with their length (not necessarily
 * NUL-terminated). */
typedef struct troupe_request {
  int64_t request_id;        /* unique among the server's live requests */
  const int32_t* prompt_ids; /* [num_prompt_ids] */
  size_t num_prompt_ids;
  const char* prompt_text; /* the prompt as text (a chat rendered by its template); empty when the client sent ids */
  size_t prompt_text_len;
  const char* tenant; /* the request's tenant (its `tenant` field, OpenAI's `user`); empty: anonymous */
  size_t tenant_len;
} troupe_request;

/* One detokenized delta of a request's output, as the output hook sees it. */
typedef struct troupe_output {
  int64_t request_id;
  const char* text; /* [text_len] the delta's new text (may end inside a word, or be empty) */
  size_t text_len;
  int32_t is_final; /* 1: the request's last delta: text held back must be released now */
} troupe_output;

/* One request's row of logits as the logits hook sees it (ABI 1.1). */
typedef struct troupe_logits {
  int64_t request_id;
  const int32_t* token_ids; /* [num_token_ids] the prompt, then every token generated so far */
  size_t num_token_ids;
  size_t num_prompt_ids; /* the first num_prompt_ids of token_ids are the prompt */
  float* logits;         /* [vocab_size] writable in place; -INFINITY masks a token. NaN or +INFINITY
                            fails the request, and so does masking every token */
  size_t vocab_size;
} troupe_logits;

/* One engine instance the route hook may choose (ABI 1.2). */
typedef struct troupe_route_candidate {
  int32_t instance_id; /* the router's id for the instance: stable for its life, never reused */
  int32_t role;        /* 0 mixed (whole requests), 1 prefill, 2 decode */
  int32_t draining;    /* 1: it finishes its requests and takes no new one: choosing it is an error */
  const char* node;    /* [node_len] the node it runs on */
  size_t node_len;
  /* As the instance last reported (with every token batch it sends): */
  int32_t num_free_blocks;  /* KV blocks free in its pool */
  int32_t num_total_blocks; /* 0: no report yet */
  int32_t num_running;      /* sequences it runs */
  int32_t num_waiting;      /* requests queued in its scheduler */
  /* As the router counts, with no reporting lag: */
  int32_t num_requests;             /* routed there and not finished */
  int64_t num_queued_prompt_tokens; /* prompt tokens of those that have no first token yet */
  /* The router's estimate of this request's prompt tokens already in the instance's prefix
   * cache (it tracks which instance last computed each prompt's first KV block): -1 when it has
   * no estimate (the prompt is shorter than a block). */
  int64_t prefix_hit_tokens;
} troupe_route_candidate;

/* A request being dispatched, as the route hook sees it (ABI 1.2). */
typedef struct troupe_route_request {
  int64_t request_id;
  const char* tenant; /* [tenant_len] its tenant: the `tenant` field (OpenAI's `user`), or the
                         [[tenants]] tenant its API key names; empty: anonymous. The key itself is
                         never passed to plugins. */
  size_t tenant_len;
  size_t num_prompt_ids;  /* the prompt's length in tokens */
  size_t num_resumed_ids; /* a re-run: output tokens it already generated on a lost instance (0 when new) */
  const troupe_route_candidate* candidates; /* [num_candidates] at least one; in instance id order */
  size_t num_candidates;
} troupe_route_request;

/* The route hook's "no opinion": *chosen as the host sets it before each call. */
#define TROUPE_ROUTE_NO_OPINION ((size_t)-1)

/* How a hook answers beyond its status. Each function copies what it is given. */
typedef struct troupe_reply troupe_reply;
struct troupe_reply {
  void* host; /* the host's; do not touch */
  /* The message of a REJECT, STOP or ERROR (and of troupe_plugin_init's failure). */
  void (*set_message)(troupe_reply* reply, const char* text, size_t len);
  /* Request hook: the prompt's ids from now on (each must be inside the model's vocabulary). */
  void (*set_prompt_ids)(troupe_reply* reply, const int32_t* ids, size_t num_ids);
  /* Output hook: the text the client gets for this delta instead of the delta's own (may be
   * empty: the plugin holds the text back, and must release it by the final delta). */
  void (*set_text)(troupe_reply* reply, const char* text, size_t len);
};

typedef struct troupe_plugin {
  uint32_t abi_major; /* set to TROUPE_PLUGIN_ABI_MAJOR */
  uint32_t abi_minor; /* set to TROUPE_PLUGIN_ABI_MINOR */
  const char* name;   /* for logs, errors and metrics; the host uses the configured name instead when given */
  void* state;        /* the plugin's, passed back to every hook */
  /* Frees the state; called once, after the last hook returned. May be NULL. */
  void (*destroy)(void* state);
  troupe_plugin_status (*on_request)(void* state, const troupe_request* request, troupe_sampling* sampling,
                                     troupe_reply* reply);
  troupe_plugin_status (*on_output)(void* state, const troupe_output* output, troupe_reply* reply);
  /* Called once when a request ends, however it ended (finished, failed, aborted), on the
   * detokenizer stage's instance (the one whose on_output saw it): drop what is kept for it. The
   * tokenizer stage's instance sees a request in one on_request call and is not told of its end,
   * so keep nothing per request there. May be NULL. */
  void (*on_request_end)(void* state, int64_t request_id);
  /* ABI 1.1. The logits hook: OK after changing row->logits in place, or ERROR (fails only that
   * request). Called from the worker's one thread, one request's row at a time, every step the
   * request samples a token; keep it to microseconds: it adds to every step of the batch. A
   * plugin built against 1.0 leaves it NULL (the host zeroes troupe_plugin before init). Its
   * requests' ends reach on_request_end of the worker's instance, as on the detokenizer's. */
  troupe_plugin_status (*on_logits)(void* state, const troupe_logits* row, troupe_reply* reply);
  /* ABI 1.2. The route hook: return OK after writing into *chosen the index (in
   * request->candidates) of the instance that takes the request, or OK leaving *chosen as the
   * host set it (TROUPE_ROUTE_NO_OPINION: the router's own policy decides), or ERROR (the
   * request fails, the message naming the plugin). An index past the candidates, or one of a
   * draining candidate, fails the request as garbage. Called on the router's one thread, one
   * request at a time (so route state needs no lock), for every dispatch; it delays every
   * request behind it: keep it to microseconds. The candidates are the instances that may take
   * the request's prompt: every mixed (and decode) instance, or in a disaggregated topology the
   * prefill instances (the router pairs the chosen one with a decode instance of its own
   * choosing). With several route plugins, the first with an opinion decides. The router's
   * instance never sees on_request_end. A plugin built against 1.1 or older leaves it NULL. */
  troupe_plugin_status (*on_route)(void* state, const troupe_route_request* request, size_t* chosen,
                                   troupe_reply* reply);
} troupe_plugin;

/* The one symbol a plugin library exports. config_json is the plugin's configuration (a JSON
 * object; "{}" when none was given). Fill *out and return 0; or return nonzero after
 * reply->set_message (the host refuses to start, naming the library and the message). */
typedef int (*troupe_plugin_init_fn)(uint32_t host_abi_major, uint32_t host_abi_minor, const char* config_json,
                                     troupe_plugin* out, troupe_reply* reply);
#define TROUPE_PLUGIN_INIT_SYMBOL "troupe_plugin_init"

#if defined(_WIN32)
#define TROUPE_PLUGIN_EXPORT __declspec(dllexport)
#else
#define TROUPE_PLUGIN_EXPORT __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
}
#endif

#endif /* TROUPE_PLUGIN_H */
