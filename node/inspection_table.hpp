#pragma once
// The table `troupe inspect` shows, like top's: one row per actor of every node, sorted by the
// column the user picks, then one row per scheduler (KV usage, running, waiting) and one line per
// node that did not answer. Plain text, no terminal codes: the command adds those.

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "node/inspection.hpp"

namespace troupe {

enum class inspect_column { node, stage, actor, mailbox, max_mailbox, rate, busy, p50, p99, messages };

// Every column in the table's order (the arrow keys move along it).
const std::vector<inspect_column>& inspect_columns();

// The column a key picks: its header's initial letter (n, s, i, m, x, r, b, p, t) or 9 for p99.
std::optional<inspect_column> column_for_key(char key);
// The column a --sort name picks ("node", "stage", "actor", "mailbox", "max", "rate", "busy",
// "p50", "p99", "messages"); throws std::invalid_argument naming the name and the choices.
inspect_column column_named(const std::string& name);

struct inspected_actor {
  std::string node;
  actor_row row;
};

// Every actor of every reachable node, sorted by `by`: numbers largest first, names in order;
// ties by node, stage and actor id, so rows keep their places between refreshes.
std::vector<inspected_actor> sorted_actors(const cluster_inspection& cluster, inspect_column by);

// The lines of the view, each at most `width` characters; at most `max_lines` of them (0: no
// bound), actor rows being cut first.
std::vector<std::string> render_inspection(const cluster_inspection& cluster, inspect_column by, size_t width,
                                           size_t max_lines = 0);

}  // namespace troupe
