#pragma once
// The detokenizer stage's work, without the actor: token deltas in, text deltas out, with one
// incremental detokenizer per live request, dropped however the request ends: its final delta
// (finished, aborted, stopped) or a failure of its step, which the batch carries after the deltas.
//
// Stop strings are matched here, the only stage that sees text. On a match the request's final
// delta (text cut before the stop string, finish "stop") is held back and the scheduler is asked
// to finish the request; its own final delta, which follows every token it sent before, releases
// the held one with the request's metrics. Deltas in between (tokens sampled before the scheduler
// heard) are dropped. So the client gets exactly one final delta, and by then the request's KV
// blocks are free.
//
// Output plugins (include/troupe/plugin.h) see each delta's text after stop strings, the last
// with is_final set: they may rewrite it (or hold some back), stop the request (as a stop string
// does, finish "stop") or fail it (the client gets the error; later deltas are dropped).

#include <optional>
#include <unordered_map>
#include <vector>

#include "plugins/plugin_chain.hpp"
#include "stages/detokenizer_resume.hpp"
#include "stages/messages.hpp"
#include "text/stop_string_matcher.hpp"
#include "text/tokenizer.hpp"

namespace troupe {

class detokenize_stage {
 public:
  struct outputs {
    text_batch texts;                      // to the frontend (when not empty)
    std::vector<request_failed> failures;  // to the frontend, after the texts
    std::vector<int64_t> stopped_ids;      // matched a stop string: the scheduler must finish them
  };

  explicit detokenize_stage(tokenizer tok, std::shared_ptr<plugin_chain> plugins = nullptr)
      : tokenizer_(std::move(tok)), plugins_(plugins && !plugins->empty() ? std::move(plugins) : nullptr) {}
  ~detokenize_stage();
  detokenize_stage(const detokenize_stage&) = delete;
  detokenize_stage& operator=(const detokenize_stage&) = delete;

  outputs run(token_batch batch);
  // Takes over a request from a lost detokenizer: spells `resume.spelled_ids` (whose text the
  // client already has) without output, so the request's next deltas continue its text exactly
  // (stages/detokenizer_resume.hpp), and hands that text to the output plugins a token at a time,
  // their answers discarded, so that their state for the request is rebuilt. Replaces any state
  // the stage held for the request.
  void resume(const detokenizer_resume_msg& resume);
  // Requests whose state the stage holds: each is dropped when the request ends, whichever way.
  size_t num_live() const { return live_.size(); }

 private:
  struct live_request {
    // The output continues the prompt: its first token keeps its leading space, and the text is
    // the tokens' bytes one after another (what logprobs' bytes add up to).
    live_request(const tokenizer& tok, std::vector<std::string> stop, bool skip_special_tokens)
        : detokenizer(tok, skip_special_tokens, /*continuation=*/true), matcher(std::move(stop)) {}

    incremental_detokenizer detokenizer;
    stop_string_matcher matcher;
    int num_output_tokens = 0;                // tokens passed on so far
    std::optional<text_delta> stopped_final;  // after a match: waits for the scheduler's final
    bool failed = false;  // a plugin failed it: the client has its error; drop all until the scheduler's final
  };

  // The text of the delta's tokens, cut at a stop string when one completes; the delta's ids
  // and logprobs are cut to the tokens that produced that text.
  std::string spell(live_request& request, token_delta& delta, bool& matched);
  // The request's state is gone: its plugins drop theirs.
  void forget(int64_t request_id);

  tokenizer tokenizer_;
  std::unordered_map<int64_t, live_request> live_;
  std::shared_ptr<plugin_chain> plugins_;  // null: none
};

}  // namespace troupe
