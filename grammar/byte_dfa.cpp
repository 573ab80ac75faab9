#include "grammar/byte_dfa.hpp"

#include <algorithm>
#include <deque>
#include <limits>
#include <string>
#include <unordered_map>

#include "grammar/grammar_error.hpp"

namespace troupe {

namespace {

// The NFA may be larger than the DFA it becomes (counted repetitions copy their operand).
constexpr size_t max_nfa_states = 2'000'000;

struct byte_edge {
  uint8_t lo, hi;
  int32_t to;
};

struct nfa {
  std::vector<std::vector<int32_t>> epsilon;  // [states]
  std::vector<std::vector<byte_edge>> edges;  // [states]

  int32_t add_state() {
    if (epsilon.size() >= max_nfa_states) {
      throw grammar_error("the pattern is too large: its automaton needs more than " + std::to_string(max_nfa_states) +
                          " NFA states (lower the repetition counts)");
    }
    epsilon.emplace_back();
    edges.emplace_back();
    return static_cast<int32_t>(epsilon.size()) - 1;
  }
};

struct fragment {
  int32_t start, end;
};

using byte_sequence = std::vector<std::pair<uint8_t, uint8_t>>;

int utf8_length(uint32_t cp) { return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; }

std::array<uint8_t, 4> utf8_bytes(uint32_t cp) {
  const int n = utf8_length(cp);
  std::array<uint8_t, 4> out{};
  if (n == 1) {
    out[0] = static_cast<uint8_t>(cp);
    return out;
  }
  for (int i = n - 1; i > 0; --i) {
    out[i] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
    cp >>= 6;
  }
  out[0] = static_cast<uint8_t>((n == 2 ? 0xC0 : n == 3 ? 0xE0 : 0xF0) | cp);
  return out;
}

// The byte-range sequences that encode exactly the code points lo..hi (the split that the
// regex-syntax crate's Utf8Sequences does): ranges of one encoded length whose continuation
// bytes vary freely are one sequence of byte ranges.
void utf8_sequences(uint32_t lo, uint32_t hi, std::vector<byte_sequence>& out) {
  static const uint32_t length_ends[] = {0x7F, 0x7FF, 0xFFFF, 0x10FFFF};
  for (uint32_t end : length_ends) {
    if (lo <= end && hi > end) {
      utf8_sequences(lo, end, out);
      utf8_sequences(end + 1, hi, out);
      return;
    }
  }
  const int n = utf8_length(lo);
  for (int i = 1; i < n; ++i) {
    const uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        utf8_sequences(lo, lo | m, out);
        utf8_sequences((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        utf8_sequences(lo, (hi & ~m) - 1, out);
        utf8_sequences(hi & ~m, hi, out);
        return;
      }
    }
  }
  const auto a = utf8_bytes(lo);
  const auto b = utf8_bytes(hi);
  byte_sequence seq;
  for (int i = 0; i < n; ++i) seq.push_back({a[i], b[i]});
  out.push_back(std::move(seq));
}

class nfa_builder {
 public:
  explicit nfa_builder(const regex_tree& tree) : tree_(tree) {}

  int32_t build(int32_t& accept) {
    const fragment f = compile(tree_.root);
    accept = f.end;
    return f.start;
  }
  nfa& automaton() { return nfa_; }

 private:
  fragment compile(int index) {
    const regex_node& node = tree_.nodes[static_cast<size_t>(index)];
    switch (node.kind) {
      case regex_node::type::empty: {
        const int32_t s = nfa_.add_state();
        return {s, s};
      }
      case regex_node::type::char_class: {
        const int32_t start = nfa_.add_state();
        const int32_t end = nfa_.add_state();
        std::vector<byte_sequence> sequences;
        for (const auto& [lo, hi] : node.ranges) utf8_sequences(lo, hi, sequences);
        for (const byte_sequence& seq : sequences) {
          int32_t from = start;
          for (size_t i = 0; i < seq.size(); ++i) {
            const int32_t to = i + 1 == seq.size() ? end : nfa_.add_state();
            nfa_.edges[static_cast<size_t>(from)].push_back({seq[i].first, seq[i].second, to});
            from = to;
          }
        }
        return {start, end};
      }
      case regex_node::type::concat: {
        fragment whole = compile(node.children[0]);
        for (size_t i = 1; i < node.children.size(); ++i) {
          const fragment next = compile(node.children[i]);
          nfa_.epsilon[static_cast<size_t>(whole.end)].push_back(next.start);
          whole.end = next.end;
        }
        return whole;
      }
      case regex_node::type::alternation: {
        const int32_t start = nfa_.add_state();
        const int32_t end = nfa_.add_state();
        for (int child : node.children) {
          const fragment f = compile(child);
          nfa_.epsilon[static_cast<size_t>(start)].push_back(f.start);
          nfa_.epsilon[static_cast<size_t>(f.end)].push_back(end);
        }
        return {start, end};
      }
      case regex_node::type::repeat: {
        const int32_t start = nfa_.add_state();
        int32_t end = start;
        for (int i = 0; i < node.min; ++i) {
          const fragment f = compile(node.children[0]);
          nfa_.epsilon[static_cast<size_t>(end)].push_back(f.start);
          end = f.end;
        }
        if (node.max < 0) {
          const fragment f = compile(node.children[0]);
          const int32_t loop = nfa_.add_state();
          nfa_.epsilon[static_cast<size_t>(end)].push_back(loop);
          nfa_.epsilon[static_cast<size_t>(loop)].push_back(f.start);
          nfa_.epsilon[static_cast<size_t>(f.end)].push_back(loop);
          return {start, loop};
        }
        // Optional copies, each reachable only after the one before: x{2,4} = xx(x(x)?)?
        const int32_t last = nfa_.add_state();
        for (int i = node.min; i < node.max; ++i) {
          const fragment f = compile(node.children[0]);
          nfa_.epsilon[static_cast<size_t>(end)].push_back(f.start);
          nfa_.epsilon[static_cast<size_t>(end)].push_back(last);
          end = f.end;
        }
        nfa_.epsilon[static_cast<size_t>(end)].push_back(last);
        return {start, last};
      }
    }
    throw grammar_error("regex: unknown node");
  }

  const regex_tree& tree_;
  nfa nfa_;
};

struct set_hash {
  size_t operator()(const std::vector<int32_t>& v) const {
    uint64_t h = 1469598103934665603ull;
    for (int32_t x : v) h = (h ^ static_cast<uint32_t>(x)) * 1099511628211ull;
    return static_cast<size_t>(h);
  }
};

}  // namespace

byte_dfa byte_dfa::compile(std::string_view pattern, int max_states) {
  return compile(parse_regex(pattern), max_states);
}

byte_dfa byte_dfa::compile(const regex_tree& tree, int max_states) {
  nfa_builder builder(tree);
  int32_t accept = 0;
  const int32_t nfa_start = builder.build(accept);
  nfa& n = builder.automaton();

  byte_dfa dfa;
  // Byte classes: bytes that no edge tells apart share a class.
  std::array<bool, 257> boundary{};
  for (const auto& edges : n.edges) {
    for (const byte_edge& e : edges) {
      boundary[e.lo] = true;
      boundary[static_cast<size_t>(e.hi) + 1] = true;
    }
  }
  int cls = -1;
  for (int b = 0; b < 256; ++b) {
    if (b == 0 || boundary[static_cast<size_t>(b)]) ++cls;
    dfa.byte_class_[static_cast<size_t>(b)] = static_cast<uint8_t>(cls);
  }
  dfa.num_classes_ = cls + 1;
  const size_t num_classes = static_cast<size_t>(dfa.num_classes_);

  std::vector<uint32_t> mark(n.epsilon.size(), 0);
  uint32_t generation = 0;
  std::vector<int32_t> stack;
  auto closure = [&](std::vector<int32_t>& set) {
    ++generation;
    stack.assign(set.begin(), set.end());
    set.clear();
    while (!stack.empty()) {
      const int32_t s = stack.back();
      stack.pop_back();
      if (mark[static_cast<size_t>(s)] == generation) continue;
      mark[static_cast<size_t>(s)] = generation;
      set.push_back(s);
      for (int32_t t : n.epsilon[static_cast<size_t>(s)]) stack.push_back(t);
    }
    std::sort(set.begin(), set.end());
  };

  std::unordered_map<std::vector<int32_t>, int32_t, set_hash> ids;
  std::vector<std::vector<int32_t>> sets;
  std::vector<int32_t> first{nfa_start};
  closure(first);
  ids.emplace(first, 0);
  sets.push_back(first);
  std::vector<std::vector<int32_t>> targets(num_classes);
  for (size_t current = 0; current < sets.size(); ++current) {
    for (auto& t : targets) t.clear();
    bool accepts = false;
    for (int32_t s : sets[current]) {
      if (s == accept) accepts = true;
      for (const byte_edge& e : n.edges[static_cast<size_t>(s)]) {
        for (int c = dfa.byte_class_[e.lo]; c <= dfa.byte_class_[e.hi]; ++c)
          targets[static_cast<size_t>(c)].push_back(e.to);
      }
    }
    dfa.accepting_.push_back(accepts ? 1 : 0);
    for (size_t c = 0; c < num_classes; ++c) {
      int32_t next = dead;
      if (!targets[c].empty()) {
        closure(targets[c]);
        auto [it, inserted] = ids.emplace(targets[c], static_cast<int32_t>(sets.size()));
        if (inserted) {
          if (static_cast<int>(sets.size()) >= max_states) {
            throw grammar_error("the grammar is too large: its automaton needs more than " +
                                std::to_string(max_states) +
                                " states (lower maxLength / maxItems / repetition counts, or simplify the schema)");
          }
          sets.push_back(targets[c]);
        }
        next = it->second;
      }
      dfa.next_.push_back(next);
    }
  }

  // Bytes to acceptance: a breadth-first search backwards from the accepting states.
  const size_t num_states = sets.size();
  std::vector<std::vector<int32_t>> reverse(num_states);
  for (size_t s = 0; s < num_states; ++s) {
    for (size_t c = 0; c < num_classes; ++c) {
      const int32_t t = dfa.next_[s * num_classes + c];
      if (t != dead) reverse[static_cast<size_t>(t)].push_back(static_cast<int32_t>(s));
    }
  }
  constexpr int32_t unreachable = std::numeric_limits<int32_t>::max();
  std::vector<int32_t> distance(num_states, unreachable);
  std::deque<int32_t> queue;
  for (size_t s = 0; s < num_states; ++s) {
    if (dfa.accepting_[s]) {
      distance[s] = 0;
      queue.push_back(static_cast<int32_t>(s));
    }
  }
  while (!queue.empty()) {
    const int32_t s = queue.front();
    queue.pop_front();
    for (int32_t p : reverse[static_cast<size_t>(s)]) {
      if (distance[static_cast<size_t>(p)] == unreachable) {
        distance[static_cast<size_t>(p)] = distance[static_cast<size_t>(s)] + 1;
        queue.push_back(p);
      }
    }
  }
  if (distance[0] == unreachable) throw grammar_error("the pattern matches nothing");

  // Drop the states that cannot reach acceptance; the start keeps number 0.
  std::vector<int32_t> renumber(num_states, dead);
  int32_t kept = 0;
  for (size_t s = 0; s < num_states; ++s) {
    if (distance[s] != unreachable) renumber[s] = kept++;
  }
  std::vector<int32_t> next(static_cast<size_t>(kept) * num_classes);
  std::vector<uint8_t> accepting(static_cast<size_t>(kept));
  std::vector<int32_t> kept_distance(static_cast<size_t>(kept));
  for (size_t s = 0; s < num_states; ++s) {
    const int32_t to = renumber[s];
    if (to == dead) continue;
    for (size_t c = 0; c < num_classes; ++c) {
      const int32_t t = dfa.next_[s * num_classes + c];
      next[static_cast<size_t>(to) * num_classes + c] = t == dead ? dead : renumber[static_cast<size_t>(t)];
    }
    accepting[static_cast<size_t>(to)] = dfa.accepting_[s];
    kept_distance[static_cast<size_t>(to)] = distance[s];
  }
  dfa.next_ = std::move(next);
  dfa.accepting_ = std::move(accepting);
  dfa.distance_ = std::move(kept_distance);
  return dfa;
}

bool byte_dfa::has_transitions(int32_t state) const {
  const size_t row = static_cast<size_t>(state) * num_classes_;
  for (int c = 0; c < num_classes_; ++c) {
    if (next_[row + static_cast<size_t>(c)] != dead) return true;
  }
  return false;
}

int32_t byte_dfa::walk(int32_t state, std::string_view bytes) const {
  for (char c : bytes) {
    if (state == dead) return dead;
    state = next(state, static_cast<uint8_t>(c));
  }
  return state;
}

}  // namespace troupe
