#pragma once
// The per-actor gauges of one inspection (node/inspection.hpp) in Prometheus's text exposition
// format, for the HTTP door's /metrics: one family per statistic, one sample per actor, labelled
// {node, stage, actor}, and the schedulers' KV usage, running and waiting labelled {node, actor}.
// A free function over plain data, so whichever part serves /metrics can append it.
//
//   troupe:actor_mailbox_depth             gauge    messages waiting when the actor last took one
//   troupe:actor_max_mailbox_depth         gauge    the most it ever saw waiting
//   troupe:actor_messages_total            counter  messages handled
//   troupe:actor_messages_per_second       gauge    over the last second
//   troupe:actor_busy_ratio                gauge    share of the last second spent in handlers
//   troupe:actor_handler_p50_seconds       gauge    handler time, last second
//   troupe:actor_handler_p99_seconds       gauge
//   troupe:actor_estimated_wait_seconds    gauge    mean mailbox wait (Little's law)
//   troupe:node_up                         gauge    1 when the node answered the inspection
//   troupe:scheduler_kv_cache_usage_perc   gauge    used share of the scheduler's KV blocks, 0 to 1
//   troupe:scheduler_num_requests_running  gauge
//   troupe:scheduler_num_requests_waiting  gauge

#include <string>

#include "node/inspection.hpp"

namespace troupe {

std::string actor_metrics_text(const cluster_inspection& cluster);

}  // namespace troupe
