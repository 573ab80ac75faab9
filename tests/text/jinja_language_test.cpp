// Language features of the Jinja subset, each rendered by Troupe and by @huggingface/jinja
// (tests/oracles/jinja_oracle.mjs) and compared byte for byte, error messages included.
#include <gtest/gtest.h>

#include "tests/text/jinja_test_support.hpp"
#include "text/jinja/template.hpp"

namespace troupe {
namespace {

struct feature_case {
  const char* name;
  const char* source;
  const char* context;  // JSON object
};

const nlohmann::ordered_json common_context = nlohmann::ordered_json::parse(R"({
  "xs": [1, 2, 3], "s": "a,b,,c", "d": {"zeta": 1, "alpha": [true, null], "k": "v"},
  "n": null, "x": "defined",
  "ms": [{"role": "system", "content": "sys"}, {"role": "user", "content": "u1"},
         {"role": "assistant", "content": "a1", "tool_calls": [{"id": "1"}]}, {"role": "user", "content": "u2"}]
})");

const feature_case feature_cases[] = {
    {"trim_and_lstrip_blocks", "a\n    {% if true %}\n    b\n    {% endif %}\nc\n", "{}"},
    {"whitespace_control", "x  {%- if true -%}  y  {%- endif -%}  z|a   {{- 'b' -}}   c|{{ 'p' }}\n  q", "{}"},
    {"comments", "a{# c #}b {#- strip -#} c\n{# line #}\nd", "{}"},
    {"loop_variables",
     "{% for m in xs %}{{ loop.index0 }}{{ loop.index }}{{ loop.first }}{{ loop.last }}{{ loop.revindex }}/"
     "{{ loop.length }};{% endfor %}",
     "{}"},
    {"loop_filter_else_break_continue",
     "{% for x in xs if x > 1 %}{{ x }}{% if loop.last %}.{% endif %}{% else %}empty{% endfor %}|"
     "{% for x in [] %}a{% else %}none{% endfor %}|"
     "{% for x in xs %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 3 %}{% break %}{% endif %}{{ x }}{% endfor "
     "%}",
     "{}"},
    {"dict_iteration",
     "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k in d %}{{ k }}{% endfor %}|{{ d|items|list }}",
     "{}"},
    {"slicing",
     "{{ xs[::-1] }} {{ xs[1:] }} {{ xs[:-1] }} {{ xs[-1] }} {{ 'h\u00e9llo'[1:3] }} {{ 'abc'[-1] }} {{ 'abc'[::-1] }} "
     "{{ xs[5] }}",
     "{}"},
    {"string_methods",
     "{{ s.startswith('a') }} {{ s.endswith(('z', 'c')) }} {{ s.split(',') }} {{ ' a  b '.split() }} {{ s.split(',', "
     "1) }}"
     " [{{ '  x '.strip() }}|{{ ' x '.lstrip() }}|{{ ' x '.rstrip() }}] {{ s.upper() }} {{ s.replace(',', ';') }}"
     " {{ 'hello world'.title() }} {{ 'abc'.capitalize() }} {{ s.length }} {{ "
     "'x</think>\\n\\nyz'.split('</think>')[-1].lstrip() }}",
     "{}"},
    {"filters",
     "{{ xs|length }} [{{ '  t  '|trim }}] {{ 3|string }} {{ xs|first }} {{ xs|last }} {{ xs|join(', ') }} {{ d|tojson "
     "}}"
     " {{ xs|reverse|list }} {{ missing|default('dflt') }} {{ ''|default('e', true) }} {{ 'x'|upper }} {{ d|length }}"
     " {{ '42'|int + 1 }} {{ '2.5'|float }} {{ true|string }} {{ -3|abs }}",
     "{}"},
    {"tojson_formats",
     "{{ data|tojson }}\n{{ data|tojson(indent=2) }}\n{{ data|tojson(ensure_ascii=true) }}\n{{ "
     "data|tojson(separators=(',', ':')) }}\n{{ data }}",
     R"({"data": {"s": "\u00e9\"\\\n\t\u0001 \ud83d\ude00", "f": 1.5, "i": 3, "neg": -2, "big": 1e21, "small": 1e-7,
         "whole": 2.0, "arr": [], "obj": {}, "nul": null, "b": false, "nested": [{"a": [1, {"b": null}]}]}})"},
    {"tests",
     "{{ x is defined }} {{ y is defined }} {{ n is none }} {{ x is string }} {{ d is mapping }} {{ xs is iterable }}"
     " {{ 3 is number }} {{ 4 is even }} {{ 3 is odd }} {{ y is undefined }} {{ x is not none }} {{ d is iterable }}"
     " {{ true is boolean }} {{ 1.5 is integer }} {{ 'ab' is lower }}",
     "{}"},
    {"membership",
     "{{ 'a' in 'cat' }} {{ 'k' in d }} {{ 2 in xs }} {{ 'z' not in xs }} {{ 'q' in missing }} {{ 'tool_calls' in "
     "ms[2] }}",
     "{}"},
    {"literals_concat_ternary",
     "{% set o = {'a': 1, 'b': [1, 2], 'c': {'d': 'e'}} %}{{ o.a ~ '-' ~ o['b'][1] }} {{ 'yes' if o.a == 1 else 'no' }}"
     " {{ o.get('z', 'fallback') }} {{ o.get('a') }} {{ o.get('z') }} {{ o.c.d }} {{ o }}",
     "{}"},
    {"namespace",
     "{% set ns = namespace(found=false, count=0) %}{% for m in ms %}{% if m.role == 'user' %}{% set ns.found = true %}"
     "{% set ns.count = ns.count + 1 %}{% endif %}{% endfor %}{{ ns.found }} {{ ns.count }}"
     "{% set inner = 1 %}{% for i in xs %}{% set inner = i %}{% endfor %} {{ inner }}",
     "{}"},
    {"macros",
     "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('Bob') }} {{ greet('Al', "
     "punct='?') }}"
     " {{ greet(name='Kw') }}",
     "{}"},
    {"set_and_filter_blocks",
     "{% set x %}inner {{ 1 + 2 }}{% endset %}[{{ x }}]{% filter upper %}shout {{ x }}{% endfilter %}", "{}"},
    {"arithmetic",
     "{{ 7 // 2 }} {{ 7 / 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ -3 + 1.5 }} {{ 1.0 }} {{ 10 * 0.1 }} {{ 0.1 + "
     "0.2 }}"
     " {{ 3.0 * 2 }} {{ 1 / 3 }} {{ 100000000000000000000.0 }} {{ -1 }}",
     "{}"},
    {"undefined_and_none",
     "[{{ missing }}|{{ missing.attr }}|{{ none }}|{{ d.missing is defined }}|{{ missing == none }}|{{ n.attr }}]",
     "{}"},
    {"string_escapes", "{{ 'tab\\there' }}|{{ \"q\\\"x\" }}|{{ 'a\\\\b' }}|{{ 'u\\u00e9' }}|{{ 'adj' 'acent' }}", "{}"},
    {"equality", "{{ 1 == 1.0 }} {{ '1' == 1 }} {{ true == 1 }} {{ [1] == [1] }} {{ ms[1] == ms[1] }} {{ 'a' != 'b' }}",
     "{}"},
    {"logic_values",
     "{{ 0 or 'x' }} {{ 'a' and 'b' }} {{ [] or 'empty' }} {{ none is not none }} {{ not xs }} {{ 1 < 2 and 2 <= 2 }}",
     "{}"},
    {"select_map_attr",
     "{{ ms|selectattr('role', 'equalto', 'user')|map(attribute='content')|join(',') }}"
     " {{ ms|rejectattr('role', 'equalto', 'user')|list|length }} {{ ms|selectattr('tool_calls')|list|length }}"
     " {{ ms|selectattr('tool_calls', 'undefined')|list|length }} {{ ms|map(attribute='missing', default='-')|join }}",
     "{}"},
    {"sorting",
     "{{ [3, 1, 2]|sort }} {{ ['b', 'A', 'c']|sort }} {{ [1, 1, 2]|unique|list }} {{ d|dictsort }} {{ "
     "ms|sort(attribute='role')|map(attribute='content')|join }}",
     "{}"},
    {"indent", "{{ 'a\\nb\\n\\nc'|indent(2) }}|{{ 'a\\nb'|indent(first=true) }}|{{ 'a\\nb'|indent }}", "{}"},
    {"range_and_concat",
     "{% for i in range(3) %}{{ i }}{% endfor %} {{ range(1, 7, 2)|list }} {{ 'v' ~ 1.0 }} {{ 'v' + [1, 'a'] }} {{ 'n' "
     "+ 2 }}",
     "{}"},
    {"generation_tags", "a {% generation %}  x  {% endgeneration %} b|{%- generation -%} y {%- endgeneration -%}|",
     "{}"},
    {"set_tuple_and_scoping", "{% set a, b = [1, 2] %}{{ a }}{{ b }}{% if true %}{% set c = 3 %}{% endif %}{{ c }}",
     "{}"},
    {"unicode_text", "\u00e9\u6f22\u5b57 {{ '\u00fcber'|upper }} {{ '\U0001F600x'|length }} {{ '\u6f22\u5b57'[0] }}",
     "{}"},
    // Rendering errors: the message must be the reference's.
    {"error_unknown_filter", "{{ x | nosuchfilter }}", "{}"},
    {"error_unknown_array_filter", "{{ xs | frobnicate }}", "{}"},
    {"error_undefined_operation", "{{ missing + 1 }}", "{}"},
    {"error_raise_exception", "{{ raise_exception('Conversation roles must alternate user/assistant') }}", "{}"},
    {"error_unknown_operator", "{{ 'x' * 2 }}", "{}"},
    {"error_unknown_test", "{{ x is frobnicated }}", "{}"},
    {"error_null_operation", "{{ none + 1 }}", "{}"},
    {"error_not_callable", "{{ x() }}", "{}"},
    {"error_not_iterable", "{% for i in 5 %}{% endfor %}", "{}"},
    {"error_set_attribute", "{% set d.x = 1 %}", "{}"},
    {"error_length_of_undefined", "{{ missing|length }}", "{}"},
    {"error_tuple_is_not_json", "{{ (1, 2) }}", "{}"},
};

class jinja_language : public ::testing::Test {};

TEST_F(jinja_language, every_feature_renders_like_the_reference) {
  if (const auto why = testing::jinja_oracle_unavailable(); !why.empty()) GTEST_SKIP() << why;
  nlohmann::ordered_json cases = nlohmann::ordered_json::array();
  std::vector<nlohmann::ordered_json> contexts;
  for (const auto& c : feature_cases) {
    nlohmann::ordered_json context = common_context;
    const auto extra = nlohmann::ordered_json::parse(c.context);
    for (auto it = extra.begin(); it != extra.end(); ++it) context[it.key()] = it.value();
    contexts.push_back(context);
    cases.push_back({{"template", c.source}, {"context", context}});
  }
  std::string error;
  const auto reference = testing::run_jinja_oracle(cases, error);
  ASSERT_TRUE(reference.has_value()) << error;
  ASSERT_EQ(reference->size(), std::size(feature_cases));
  for (std::size_t i = 0; i < std::size(feature_cases); ++i) {
    SCOPED_TRACE(feature_cases[i].name);
    const auto mine = testing::render_in_cpp(feature_cases[i].source, contexts[i]);
    const auto& ref = (*reference)[i];
    EXPECT_EQ(mine.ok, ref.ok) << "troupe: " << mine.output << "\nreference: " << ref.output;
    EXPECT_EQ(mine.output, ref.output) << testing::first_difference(mine.output, ref.output);
    // Names starting with error_ must fail in both, or the case tests nothing.
    if (std::string(feature_cases[i].name).rfind("error_", 0) == 0) {
      EXPECT_FALSE(ref.ok);
    }
  }
}

// The same behaviours, pinned without node, so that a machine without the oracle still checks them.
std::string render(const std::string& source,
                   const nlohmann::ordered_json& context = nlohmann::ordered_json::object()) {
  const auto r = testing::render_in_cpp(source, context);
  if (!r.ok) throw std::runtime_error(r.output);
  return r.output;
}

TEST(jinja_language_pinned, whitespace_control_matches_hf_settings) {
  EXPECT_EQ(render("a\n    {% if true %}\n    b\n    {% endif %}\nc\n"), "a\n    b\nc");
  EXPECT_EQ(render("x  {%- if true -%}  y  {%- endif -%}  z"), "xyz");
}

TEST(jinja_language_pinned, loops_slices_and_namespace) {
  EXPECT_EQ(
      render("{% for x in [1, 2, 3][::-1] %}{{ loop.index0 }}{{ x }}{% if not loop.last %},{% endif %}{% endfor %}"),
      "03,12,21");
  EXPECT_EQ(render("{% set ns = namespace(n=0) %}{% for x in [1, 2] %}{% set ns.n = ns.n + x %}{% endfor %}{{ ns.n }}"),
            "3");
}

TEST(jinja_language_pinned, tojson_uses_python_separators) {
  const auto ctx = nlohmann::ordered_json::parse(R"({"t": {"b": [1, 2.5], "a": "\u00e9"}})");
  EXPECT_EQ(render("{{ t|tojson }}", ctx), "{\"b\": [1, 2.5], \"a\": \"\u00e9\"}");
  EXPECT_EQ(render("{{ t|tojson(indent=2) }}", ctx), "{\n  \"b\": [\n    1,\n    2.5\n  ],\n  \"a\": \"\u00e9\"\n}");
}

TEST(jinja_language_pinned, output_formats_follow_the_reference) {
  EXPECT_EQ(render("{{ 1.0 }} {{ 0.1 + 0.2 }} {{ true }} {{ none }}|{{ missing }}|{{ [1, 'a'] }}"),
            "1.0 0.30000000000000004 true ||[1, \"a\"]");
}

}  // namespace
}  // namespace troupe
