#pragma once
// The doors' one actor: the stages send replies here and it hands each to the door its request
// came through (reply_router). Included only by the node (it pulls in CAF).
//
// It also counts the output tokens each running request's client has been sent, and answers the
// router's (delivered_tokens_atom, ids) with them ([i]: tokens of ids[i], -1 when the client has
// had the request's end): what a detokenizer placed in place of a lost one resumes from
// (stages/detokenizer_ledger.hpp).

#include "stages/stage_interfaces.hpp"

namespace troupe {

class reply_router;

frontend_handle::behavior_type door_actor(frontend_handle::pointer self, reply_router* router);

}  // namespace troupe
