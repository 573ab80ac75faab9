#include "text/jinja/parser.hpp"

#include <algorithm>
#include <cstdlib>
#include <initializer_list>
#include <set>
#include <string>

#include "text/jinja/error.hpp"

namespace troupe {

namespace {

using tt = jinja_token_type;
using nk = jinja_node_kind;

class parser {
 public:
  parser(std::string_view source, std::vector<jinja_token> tokens) : source_(source), tokens_(std::move(tokens)) {}

  jinja_node_ptr run() {
    auto program = make(nk::program, 0);
    while (current_ < tokens_.size()) program->body.push_back(parse_any());
    return program;
  }

 private:
  [[noreturn]] void fail(const std::string& what, std::size_t offset) const {
    const auto p = locate(source_, offset);
    throw jinja_syntax_error(what, p.line, p.column);
  }
  [[noreturn]] void fail_here(const std::string& what) const { fail(what, here()); }

  std::size_t here() const { return current_ < tokens_.size() ? tokens_[current_].offset : source_.size(); }

  static jinja_node_ptr make(nk kind, std::size_t offset) { return std::make_unique<jinja_node>(kind, offset); }

  const jinja_token& peek() const {
    if (current_ >= tokens_.size()) fail_here("Unexpected end of template");
    return tokens_[current_];
  }

  const jinja_token& next() {
    const jinja_token& t = peek();
    ++current_;
    return t;
  }

  bool is(std::initializer_list<tt> types) const {
    if (current_ + types.size() > tokens_.size()) return false;
    std::size_t i = current_;
    for (tt t : types)
      if (tokens_[i++].type != t) return false;
    return true;
  }
  bool is(tt type) const { return is({type}); }

  bool is_identifier(std::initializer_list<const char*> names) const {
    if (current_ + names.size() > tokens_.size()) return false;
    std::size_t i = current_;
    for (const char* n : names) {
      const auto& t = tokens_[i++];
      if (t.type != tt::identifier || t.value != n) return false;
    }
    return true;
  }
  bool is_identifier(const char* name) const { return is_identifier({name}); }

  bool is_statement(std::initializer_list<const char*> names) const {
    if (current_ + 1 >= tokens_.size()) return false;
    if (tokens_[current_].type != tt::open_statement || tokens_[current_ + 1].type != tt::identifier) return false;
    return std::any_of(names.begin(), names.end(), [&](const char* n) { return tokens_[current_ + 1].value == n; });
  }

  const jinja_token& expect(tt type, const std::string& what) {
    if (current_ >= tokens_.size()) fail_here(what + ", got end of template");
    const jinja_token& t = tokens_[current_];
    if (t.type != type)
      fail(what + ", got " + to_string(t.type) + (t.value.empty() ? "" : " '" + t.value + "'"), t.offset);
    ++current_;
    return t;
  }

  void expect_identifier(const char* name) {
    if (!is_identifier(name)) fail_here(std::string("Expected ") + name);
    ++current_;
  }

  // Statements are read until one of `names` opens; running out of tokens means a missing end tag.
  void parse_until(std::vector<jinja_node_ptr>& into, std::initializer_list<const char*> names, const char* closer,
                   std::size_t opened_at) {
    while (!is_statement(names)) {
      if (current_ >= tokens_.size())
        fail(std::string("Missing {% ") + closer + " %} for the block opened here", opened_at);
      into.push_back(parse_any());
    }
  }

  jinja_node_ptr parse_any() {
    const jinja_token& t = peek();
    switch (t.type) {
      case tt::comment: {
        ++current_;
        auto n = make(nk::comment, t.offset);
        n->text = t.value;
        return n;
      }
      case tt::text: {
        ++current_;
        auto n = make(nk::text, t.offset);
        n->text = t.value;
        return n;
      }
      case tt::open_statement: return parse_statement();
      case tt::open_expression: {
        ++current_;
        auto e = parse_expression();
        expect(tt::close_expression, "Expected closing expression token '}}'");
        return e;
      }
      default: fail(std::string("Unexpected token type: ") + to_string(t.type), t.offset);
    }
  }

  jinja_node_ptr parse_statement() {
    const std::size_t open = expect(tt::open_statement, "Expected opening statement token").offset;
    const jinja_token& name_token = peek();
    if (name_token.type != tt::identifier)
      fail(std::string("Unknown statement, got ") + to_string(name_token.type), name_token.offset);
    const std::string name = name_token.value;
    jinja_node_ptr result;
    if (name == "set") {
      ++current_;
      result = parse_set(open);
    } else if (name == "if") {
      ++current_;
      result = parse_if(open);
      expect(tt::open_statement, "Expected {% endif %}");
      expect_identifier("endif");
      expect(tt::close_statement, "Expected %} token");
    } else if (name == "for") {
      ++current_;
      result = parse_for(open);
      expect(tt::open_statement, "Expected {% endfor %}");
      expect_identifier("endfor");
      expect(tt::close_statement, "Expected %} token");
    } else if (name == "macro") {
      ++current_;
      result = parse_macro(open);
      expect(tt::open_statement, "Expected {% endmacro %}");
      expect_identifier("endmacro");
      expect(tt::close_statement, "Expected %} token");
    } else if (name == "break" || name == "continue") {
      ++current_;
      expect(tt::close_statement, "Expected closing statement token");
      result = make(name == "break" ? nk::break_statement : nk::continue_statement, open);
    } else if (name == "filter") {
      ++current_;
      result = make(nk::filter_statement, open);
      auto filter = parse_primary();
      if (filter->kind == nk::identifier && is(tt::open_paren)) filter = parse_call(std::move(filter));
      result->children.push_back(std::move(filter));
      expect(tt::close_statement, "Expected closing statement token");
      parse_until(result->body, {"endfilter"}, "endfilter", open);
      expect(tt::open_statement, "Expected '{%'");
      expect_identifier("endfilter");
      expect(tt::close_statement, "Expected '%}'");
    } else {
      fail("Unknown statement type: " + name, name_token.offset);
    }
    return result;
  }

  jinja_node_ptr parse_set(std::size_t open) {
    auto n = make(nk::set_statement, open);
    n->children.push_back(parse_expression_sequence(false));
    if (is(tt::equals)) {
      ++current_;
      n->children.push_back(parse_expression_sequence(false));
    } else {
      n->children.push_back(nullptr);
      expect(tt::close_statement, "Expected %} token");
      parse_until(n->body, {"endset"}, "endset", open);
      expect(tt::open_statement, "Expected {% token");
      expect_identifier("endset");
    }
    expect(tt::close_statement, "Expected closing statement token");
    return n;
  }

  jinja_node_ptr parse_if(std::size_t open) {
    auto n = make(nk::if_statement, open);
    n->children.push_back(parse_expression());
    expect(tt::close_statement, "Expected closing statement token");
    parse_until(n->body, {"elif", "else", "endif"}, "endif", open);
    if (is_statement({"elif"})) {
      const std::size_t elif_at = tokens_[current_].offset;
      current_ += 2;
      n->alternate.push_back(parse_if(elif_at));
    } else if (is_statement({"else"})) {
      current_ += 2;
      expect(tt::close_statement, "Expected closing statement token");
      parse_until(n->alternate, {"endif"}, "endif", open);
    }
    return n;
  }

  jinja_node_ptr parse_macro(std::size_t open) {
    auto n = make(nk::macro, open);
    auto name = parse_primary();
    if (name->kind != nk::identifier) fail("Expected identifier following macro statement", name->offset);
    n->text = name->text;
    n->children = parse_args(true);
    expect(tt::close_statement, "Expected closing statement token");
    parse_until(n->body, {"endmacro"}, "endmacro", open);
    return n;
  }

  jinja_node_ptr parse_for(std::size_t open) {
    auto n = make(nk::for_statement, open);
    auto loop_var = parse_expression_sequence(true);
    if (loop_var->kind != nk::identifier && loop_var->kind != nk::tuple_literal) {
      fail("Expected identifier/tuple for the loop variable", loop_var->offset);
    }
    if (!is_identifier("in")) fail_here("Expected `in` keyword following loop variable");
    ++current_;
    n->children.push_back(std::move(loop_var));
    n->children.push_back(parse_expression());
    expect(tt::close_statement, "Expected closing statement token");
    parse_until(n->body, {"endfor", "else"}, "endfor", open);
    if (is_statement({"else"})) {
      current_ += 2;
      expect(tt::close_statement, "Expected closing statement token");
      parse_until(n->alternate, {"endfor"}, "endfor", open);
    }
    return n;
  }

  jinja_node_ptr parse_expression_sequence(bool primary) {
    const std::size_t at = here();
    std::vector<jinja_node_ptr> items;
    items.push_back(primary ? parse_primary() : parse_expression());
    const bool is_tuple = is(tt::comma);
    while (is_tuple) {
      ++current_;
      items.push_back(primary ? parse_primary() : parse_expression());
      if (!is(tt::comma)) break;
    }
    if (!is_tuple) return std::move(items[0]);
    auto t = make(nk::tuple_literal, at);
    t->children = std::move(items);
    return t;
  }

  jinja_node_ptr parse_expression() { return parse_if_expression(); }

  jinja_node_ptr parse_if_expression() {
    auto a = parse_or();
    if (is_identifier("if")) {
      const std::size_t at = tokens_[current_].offset;
      ++current_;
      auto test = parse_or();
      if (is_identifier("else")) {
        ++current_;
        auto n = make(nk::ternary, at);
        n->children.push_back(std::move(test));
        n->children.push_back(std::move(a));
        n->children.push_back(parse_if_expression());
        return n;
      }
      auto n = make(nk::select, at);
      n->children.push_back(std::move(a));
      n->children.push_back(std::move(test));
      return n;
    }
    return a;
  }

  jinja_node_ptr binary(const jinja_token& op, jinja_node_ptr left, jinja_node_ptr right) {
    auto n = make(nk::binary, op.offset);
    n->text = op.value;
    n->children.push_back(std::move(left));
    n->children.push_back(std::move(right));
    return n;
  }

  jinja_node_ptr parse_or() {
    auto left = parse_and();
    while (is_identifier("or")) {
      const jinja_token& op = next();
      left = binary(op, std::move(left), parse_and());
    }
    return left;
  }

  jinja_node_ptr parse_and() {
    auto left = parse_not();
    while (is_identifier("and")) {
      const jinja_token& op = next();
      left = binary(op, std::move(left), parse_not());
    }
    return left;
  }

  jinja_node_ptr parse_not() {
    if (is_identifier("not")) {
      const jinja_token& op = next();
      auto n = make(nk::unary, op.offset);
      n->text = "not";
      n->children.push_back(parse_not());
      return n;
    }
    return parse_comparison();
  }

  jinja_node_ptr parse_comparison() {
    auto left = parse_additive();
    while (true) {
      jinja_token op;
      if (is_identifier({"not", "in"})) {
        op = {tt::identifier, "not in", tokens_[current_].offset};
        current_ += 2;
      } else if (is_identifier("in") || is(tt::comparison_operator)) {
        op = next();
      } else {
        break;
      }
      left = binary(op, std::move(left), parse_additive());
    }
    return left;
  }

  jinja_node_ptr parse_additive() {
    auto left = parse_multiplicative();
    while (is(tt::additive_operator)) {
      const jinja_token& op = next();
      left = binary(op, std::move(left), parse_multiplicative());
    }
    return left;
  }

  jinja_node_ptr parse_multiplicative() {
    auto left = parse_power();
    while (is(tt::multiplicative_operator)) {
      const jinja_token& op = next();
      left = binary(op, std::move(left), parse_power());
    }
    return left;
  }

  jinja_node_ptr parse_power() {
    auto left = parse_test();
    while (is(tt::exponentiation_operator)) {
      const jinja_token& op = next();
      left = binary(op, std::move(left), parse_test());
    }
    return left;
  }

  jinja_node_ptr parse_test() {
    auto operand = parse_filter();
    while (is_identifier("is")) {
      const std::size_t at = tokens_[current_].offset;
      ++current_;
      const bool negate = is_identifier("not");
      if (negate) ++current_;
      auto name = parse_primary();
      if (name->kind != nk::identifier) fail("Expected identifier for the test", name->offset);
      auto n = make(nk::test, at);
      n->text = name->text;
      n->flag = negate;
      n->children.push_back(std::move(operand));
      operand = std::move(n);
    }
    return operand;
  }

  jinja_node_ptr parse_filter() {
    auto operand = parse_unary_sign();
    while (is(tt::pipe)) {
      const std::size_t at = tokens_[current_].offset;
      ++current_;
      auto filter = parse_primary();
      if (filter->kind != nk::identifier) fail("Expected identifier for the filter", filter->offset);
      if (is(tt::open_paren)) filter = parse_call(std::move(filter));
      auto n = make(nk::filter, at);
      n->children.push_back(std::move(operand));
      n->children.push_back(std::move(filter));
      operand = std::move(n);
    }
    return operand;
  }

  jinja_node_ptr parse_unary_sign() {
    if (current_ < tokens_.size()) {
      const jinja_token& t = tokens_[current_];
      if ((t.type == tt::unary_operator || t.type == tt::additive_operator) && (t.value == "-" || t.value == "+")) {
        ++current_;
        auto n = make(nk::unary, t.offset);
        n->text = t.value;
        n->children.push_back(parse_unary_sign());
        return n;
      }
    }
    return parse_call_member();
  }

  jinja_node_ptr parse_call_member() {
    auto member = parse_member(parse_primary());
    if (is(tt::open_paren)) return parse_call(std::move(member));
    return member;
  }

  jinja_node_ptr parse_call(jinja_node_ptr callee) {
    auto n = make(nk::call, callee->offset);
    n->children.push_back(std::move(callee));
    for (auto& a : parse_args(false)) n->children.push_back(std::move(a));
    jinja_node_ptr expression = parse_member(std::move(n));
    if (is(tt::open_paren)) expression = parse_call(std::move(expression));
    return expression;
  }

  std::vector<jinja_node_ptr> parse_args(bool parameters) {
    expect(tt::open_paren, "Expected opening parenthesis for arguments list");
    std::vector<jinja_node_ptr> args;
    std::set<std::string> names;
    bool saw_keyword = false;
    while (!is(tt::close_paren)) {
      if (current_ >= tokens_.size()) fail_here("Expected closing parenthesis for arguments list");
      if (is(tt::exponentiation_operator) || (is(tt::multiplicative_operator) && tokens_[current_].value == "*")) {
        fail_here("Argument unpacking (* and **) is not supported");
      }
      auto argument = parse_expression();
      if (is(tt::equals)) {
        ++current_;
        if (argument->kind != nk::identifier) {
          fail(
              parameters ? "Expected identifier for parameter declaration" : "Expected identifier for keyword argument",
              argument->offset);
        }
        auto kw = make(nk::keyword_argument, argument->offset);
        kw->text = argument->text;
        kw->children.push_back(parse_expression());
        argument = std::move(kw);
      }
      if (parameters) {
        if (argument->kind != nk::identifier && argument->kind != nk::keyword_argument) {
          fail("Expected identifier for parameter declaration", argument->offset);
        }
        if (!names.insert(argument->text).second) fail("Duplicate parameter name: " + argument->text, argument->offset);
      }
      if (argument->kind == nk::keyword_argument) {
        saw_keyword = true;
      } else if (saw_keyword) {
        fail(parameters ? "Non-default argument follows default argument"
                        : "Positional arguments must come before keyword arguments",
             argument->offset);
      }
      args.push_back(std::move(argument));
      if (is(tt::comma)) ++current_;
    }
    expect(tt::close_paren, "Expected closing parenthesis for arguments list");
    return args;
  }

  // Inside [ ]: an index, or a slice with up to three colon-separated parts.
  jinja_node_ptr parse_subscript() {
    const std::size_t at = here();
    std::vector<jinja_node_ptr> parts;
    bool is_slice = false;
    while (!is(tt::close_square_bracket)) {
      if (current_ >= tokens_.size()) fail_here("Expected closing square bracket");
      if (is(tt::colon)) {
        parts.push_back(nullptr);
        ++current_;
        is_slice = true;
      } else {
        parts.push_back(parse_expression());
        if (is(tt::colon)) {
          ++current_;
          is_slice = true;
        }
      }
    }
    if (parts.empty()) fail(std::string("Expected at least one argument for member/slice expression"), at);
    if (!is_slice) return std::move(parts[0]);
    if (parts.size() > 3) fail("Expected 0-3 arguments for slice expression", at);
    auto n = make(nk::slice, at);
    parts.resize(3);
    n->children = std::move(parts);
    return n;
  }

  jinja_node_ptr parse_member(jinja_node_ptr object) {
    while (is(tt::dot) || is(tt::open_square_bracket)) {
      const jinja_token& op = next();
      const bool computed = op.type == tt::open_square_bracket;
      jinja_node_ptr property;
      if (computed) {
        property = parse_subscript();
        expect(tt::close_square_bracket, "Expected closing square bracket");
      } else {
        property = parse_primary();
        if (property->kind != nk::identifier && property->kind != nk::integer_literal) {
          fail("Expected identifier or integer following dot operator", property->offset);
        }
      }
      auto n = make(nk::member, op.offset);
      n->flag = computed;
      n->children.push_back(std::move(object));
      n->children.push_back(std::move(property));
      object = std::move(n);
    }
    return object;
  }

  jinja_node_ptr parse_primary() {
    const jinja_token& t = next();
    switch (t.type) {
      case tt::numeric_literal: {
        if (t.value.find('.') != std::string::npos) {
          auto n = make(nk::float_literal, t.offset);
          n->number = std::strtod(t.value.c_str(), nullptr);
          return n;
        }
        auto n = make(nk::integer_literal, t.offset);
        n->integer = std::strtoll(t.value.c_str(), nullptr, 10);
        return n;
      }
      case tt::string_literal: {
        auto n = make(nk::string_literal, t.offset);
        n->text = t.value;
        while (is(tt::string_literal)) n->text += next().value;  // adjacent literals concatenate
        return n;
      }
      case tt::identifier: {
        auto n = make(nk::identifier, t.offset);
        n->text = t.value;
        return n;
      }
      case tt::open_paren: {
        auto e = parse_expression_sequence(false);
        expect(tt::close_paren, "Expected closing parenthesis");
        return e;
      }
      case tt::open_square_bracket: {
        auto n = make(nk::array_literal, t.offset);
        while (!is(tt::close_square_bracket)) {
          if (current_ >= tokens_.size()) fail("Expected closing square bracket", t.offset);
          n->children.push_back(parse_expression());
          if (is(tt::comma)) ++current_;
        }
        ++current_;
        return n;
      }
      case tt::open_curly_bracket: {
        auto n = make(nk::object_literal, t.offset);
        while (!is(tt::close_curly_bracket)) {
          if (current_ >= tokens_.size()) fail("Expected closing curly bracket", t.offset);
          n->children.push_back(parse_expression());
          expect(tt::colon, "Expected colon between key and value in object literal");
          n->children.push_back(parse_expression());
          if (is(tt::comma)) ++current_;
        }
        ++current_;
        return n;
      }
      default: fail(std::string("Unexpected token: ") + to_string(t.type), t.offset);
    }
  }

  std::string_view source_;
  std::vector<jinja_token> tokens_;
  std::size_t current_ = 0;
};

}  // namespace

jinja_node_ptr parse_template(std::string_view source) { return parser(source, tokenize(source)).run(); }

}  // namespace troupe
