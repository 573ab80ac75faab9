// Errors a template author or a client can meet: syntax errors name line and column in the
// original source (before trim_blocks/lstrip_blocks rewrote it); rendering errors carry the
// reference's message (the unknown filter's name, the template's own raise_exception text).
#include <gtest/gtest.h>

#include "text/chat_template.hpp"
#include "text/jinja/error.hpp"
#include "text/jinja/template.hpp"

namespace troupe {
namespace {

struct syntax_case {
  const char* source;
  int line;
  int column;
  const char* message_part;
};

const syntax_case syntax_cases[] = {
    {"line one\n{% if x %}\n{{ x + }}\n{% endif %}", 3, 8, "Unexpected token: CloseExpression"},
    {"{% if x %}\nabc", 1, 1, "Missing {% endif %}"},
    {"ok\n  {{ 'abc }}", 2, 6, "unterminated string"},
    {"{% frobnicate %}", 1, 4, "Unknown statement type: frobnicate"},
    {"a\n    {% iff x %}{% endiff %}", 2, 8, "Unknown statement type: iff"},
    {"{% for %}{% endfor %}", 1, 8, "Unexpected token: CloseStatement"},
    {"{{ 'bad \\q escape' }}", 1, 9, "Unexpected escaped character: q"},
    {"{# never closed", 1, 1, "Missing end of comment tag"},
    {"\u00e9\u00e9 {{ x | }}", 1, 11, "Unexpected token: CloseExpression"},
    {"{% set x = [1, 2 %}", 1, 18, "CloseStatement"},
};

TEST(jinja_errors, syntax_errors_name_line_and_column) {
  for (const auto& c : syntax_cases) {
    SCOPED_TRACE(c.source);
    try {
      jinja_template t(c.source);
      ADD_FAILURE() << "parsed without error";
    } catch (const jinja_syntax_error& e) {
      EXPECT_EQ(e.line(), c.line) << e.what();
      EXPECT_EQ(e.column(), c.column) << e.what();
      const std::string where = std::to_string(c.line) + ":" + std::to_string(c.column);
      EXPECT_NE(std::string(e.what()).find(where), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(c.message_part), std::string::npos) << e.what();
    }
  }
}

TEST(jinja_errors, chat_template_reports_syntax_errors_as_runtime_error) {
  EXPECT_THROW(chat_template("{% if messages %}never closed"), std::runtime_error);
}

std::string render_error(const std::string& source, const nlohmann::json& messages) {
  try {
    chat_template(source).apply(messages, false, "<s>", "</s>");
  } catch (const jinja_runtime_error& e) {
    return e.what();
  }
  return "no error";
}

TEST(jinja_errors, unknown_filter_is_named) {
  const auto messages = nlohmann::json::parse(R"([{"role": "user", "content": "hi"}])");
  EXPECT_EQ(render_error("{{ messages[0].content | shout }}", messages), "Unknown StringValue filter: shout");
  EXPECT_EQ(render_error("{{ messages | shout(1) }}", messages), "Unknown ArrayValue filter: shout");
}

TEST(jinja_errors, raise_exception_carries_the_template_message) {
  // Mistral v0.1's alternation check, applied to two user turns in a row.
  const std::string source =
      "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
      "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
      "{{ message['content'] }}{% endfor %}";
  const auto messages =
      nlohmann::json::parse(R"([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])");
  EXPECT_EQ(render_error(source, messages), "Conversation roles must alternate user/assistant/user/assistant/...");
}

TEST(jinja_errors, undefined_values_in_arithmetic_fail_clearly) {
  EXPECT_EQ(render_error("{{ nothing + 1 }}", nlohmann::json::array()),
            "Cannot perform operation + on undefined values");
}

TEST(jinja_errors, apply_rejects_bad_arguments) {
  const chat_template t("{{ messages|length }}");
  EXPECT_THROW(t.apply(nlohmann::json::object(), false, "", ""), std::invalid_argument);
  EXPECT_THROW(t.apply(nlohmann::json::array(), false, "", "", nlohmann::json{{"messages", 1}}), std::invalid_argument);
  EXPECT_EQ(t.apply(nlohmann::json::array({1, 2}), false, "", ""), "2");
}

}  // namespace
}  // namespace troupe
