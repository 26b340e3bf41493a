// SentencePieceTokenizer's segmenters, one per TrainerSpec.ModelType: each
// splits the normalized text into pieces exactly as sentencepiece's
// model of that type does.
#include "policies/tokenizer/sentencepiece_model.h"

#include <algorithm>
#include <functional>
#include <queue>
#include <unordered_map>
#include <utility>

#include "policies/tokenizer/piece_syntax.h"
#include "policies/tokenizer/sentencepiece_tries.h"
#include "policies/tokenizer/unicode.h"

namespace strata::policies {
namespace {

using internal::kSpaceSymbol;
using PieceType = SentencePieceModelProto::PieceType;

// What a unigram lattice charges for a character no piece covers, below the
// worst piece score (sentencepiece's kUnkPenalty).
constexpr float kUnkPenalty = 10.0f;

}  // namespace

std::vector<SentencePieceTokenizer::Result> SentencePieceTokenizer::EncodeBpe(std::string_view normalized) const {
  // sentencepiece's BPE: start from characters (user-defined symbols are
  // single frozen symbols) and repeatedly merge the adjacent pair whose
  // concatenation is the highest-scoring piece, leftmost on ties.
  struct Symbol {
    int prev;
    int next;
    bool freeze;
    size_t begin;
    size_t length;  // 0 once merged into its left neighbour
  };
  struct Candidate {
    int left;
    int right;
    float score;
    size_t length;
  };
  struct Lower {
    bool operator()(const Candidate& a, const Candidate& b) const {
      return a.score < b.score || (a.score == b.score && a.left > b.left);
    }
  };
  std::vector<Symbol> symbols;
  symbols.reserve(normalized.size());
  for (size_t pos = 0; pos < normalized.size();) {
    size_t length = MatchUserDefined(normalized.substr(pos));
    const bool freeze = length > 0;
    if (!freeze) {
      length = std::min(Utf8LengthFromLeadByte(static_cast<uint8_t>(normalized[pos])), normalized.size() - pos);
    }
    const int index = static_cast<int>(symbols.size());
    symbols.push_back({index - 1, -1, freeze, pos, length});
    pos += length;
    if (pos < normalized.size()) symbols.back().next = index + 1;
  }
  if (symbols.empty()) return {};

  std::priority_queue<Candidate, std::vector<Candidate>, Lower> agenda;
  // Merged pieces that are UNUSED in the vocabulary are split back into the
  // two pieces they were made from (sentencepiece's resegmentation).
  std::unordered_map<std::string_view, std::pair<std::string_view, std::string_view>> rev_merge;
  auto piece_of = [&](const Symbol& s) { return normalized.substr(s.begin, s.length); };
  auto maybe_add = [&](int left, int right) {
    if (left < 0 || right < 0 || symbols[left].freeze || symbols[right].freeze) return;
    const std::string_view merged = normalized.substr(symbols[left].begin,
                                                      symbols[left].length + symbols[right].length);
    const int32_t id = LookupNormal(merged);
    if (id < 0) return;
    agenda.push({left, right, proto_.pieces[static_cast<size_t>(id)].score, merged.size()});
    if (IsType(id, PieceType::kUnused)) {
      rev_merge[merged] = {piece_of(symbols[left]), piece_of(symbols[right])};
    }
  };
  for (size_t i = 1; i < symbols.size(); ++i) {
    maybe_add(static_cast<int>(i) - 1, static_cast<int>(i));
  }
  while (!agenda.empty()) {
    const Candidate top = agenda.top();
    agenda.pop();
    Symbol& left = symbols[top.left];
    Symbol& right = symbols[top.right];
    // Stale: one side was merged away or grew since this pair was queued.
    if (left.length == 0 || right.length == 0 || left.length + right.length != top.length) {
      continue;
    }
    left.length += right.length;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.left;
    right.length = 0;
    maybe_add(left.prev, top.left);
    maybe_add(top.left, left.next);
  }

  std::vector<Result> results;
  std::function<void(std::string_view)> resegment = [&](std::string_view piece) {
    const int32_t id = LookupOrUnk(piece);
    if (IsType(id, PieceType::kUnused)) {
      if (const auto it = rev_merge.find(piece); it != rev_merge.end()) {
        resegment(it->second.first);
        resegment(it->second.second);
        return;
      }
    }
    results.push_back({piece, id});
  };
  for (int i = 0; i != -1; i = symbols[i].next) resegment(piece_of(symbols[i]));
  return results;
}

std::vector<SentencePieceTokenizer::Result> SentencePieceTokenizer::EncodeUnigram(std::string_view normalized) const {
  // Viterbi over the lattice of all pieces, computed on the fly as in
  // sentencepiece's optimized unigram encoder: best_ends_at[i] is the best
  // path covering normalized[0, i). Score arithmetic mirrors sentencepiece's
  // (float path scores, double user-defined bonus) so ties break the same way.
  struct BestPath {
    int32_t id = -1;
    float score = 0.0f;
    int64_t starts_at = -1;
  };
  const size_t size = normalized.size();
  const float unk_score = min_score_ - kUnkPenalty;
  std::vector<BestPath> best(size + 1);
  size_t starts_at = 0;
  while (starts_at < size) {
    const float score_till_here = best[starts_at].score;
    bool has_single_node = false;
    const size_t char_length = std::min(Utf8LengthFromLeadByte(static_cast<uint8_t>(normalized[starts_at])),
                                        size - starts_at);
    normal_trie_->ForEachPrefix(normalized.substr(starts_at), [&](size_t length, int32_t id) {
      const auto& piece = proto_.pieces[static_cast<size_t>(id)];
      if (piece.type == PieceType::kUnused) return;
      BestPath& target = best[starts_at + length];
      const double score = piece.type == PieceType::kUserDefined
                               ? static_cast<double>(static_cast<float>(length) * max_score_) - 0.1
                               : static_cast<double>(piece.score);
      const double candidate = score + static_cast<double>(score_till_here);
      if (target.starts_at == -1 || candidate > static_cast<double>(target.score)) {
        target.score = static_cast<float>(candidate);
        target.starts_at = static_cast<int64_t>(starts_at);
        target.id = id;
      }
      if (length == char_length) has_single_node = true;
    });
    if (!has_single_node) {
      BestPath& target = best[starts_at + char_length];
      const float candidate = unk_score + score_till_here;
      if (target.starts_at == -1 || candidate > target.score) {
        target.score = candidate;
        target.starts_at = static_cast<int64_t>(starts_at);
        target.id = unk_id_;
      }
    }
    starts_at += char_length;
  }
  std::vector<Result> results;
  for (size_t end = size; end > 0;) {
    const BestPath& node = best[end];
    const auto begin = static_cast<size_t>(node.starts_at);
    results.push_back({normalized.substr(begin, end - begin), node.id});
    end = begin;
  }
  std::reverse(results.begin(), results.end());
  return results;
}

std::vector<SentencePieceTokenizer::Result> SentencePieceTokenizer::EncodeWord(std::string_view normalized) const {
  // Words start at each U+2581 (or end after it with the suffix convention).
  std::vector<Result> results;
  const bool suffix = proto_.treat_whitespace_as_suffix;
  size_t word_begin = 0;
  for (size_t pos = 0; pos < normalized.size();) {
    const size_t length = std::min(Utf8LengthFromLeadByte(static_cast<uint8_t>(normalized[pos])),
                                   normalized.size() - pos);
    const bool is_space = normalized.substr(pos, length) == kSpaceSymbol;
    if (!suffix && is_space && pos > word_begin) {
      results.push_back({normalized.substr(word_begin, pos - word_begin), 0});
      word_begin = pos;
    }
    pos += length;
    if (suffix && is_space) {
      results.push_back({normalized.substr(word_begin, pos - word_begin), 0});
      word_begin = pos;
    }
  }
  if (word_begin < normalized.size()) results.push_back({normalized.substr(word_begin), 0});
  for (Result& r : results) r.id = LookupOrUnk(r.piece);
  return results;
}

std::vector<SentencePieceTokenizer::Result> SentencePieceTokenizer::EncodeChar(std::string_view normalized) const {
  std::vector<Result> results;
  for (size_t pos = 0; pos < normalized.size();) {
    size_t length = MatchUserDefined(normalized.substr(pos));
    if (length == 0) {
      length = std::min(Utf8LengthFromLeadByte(static_cast<uint8_t>(normalized[pos])), normalized.size() - pos);
    }
    const std::string_view piece = normalized.substr(pos, length);
    results.push_back({piece, LookupOrUnk(piece)});
    pos += length;
  }
  return results;
}

}  // namespace strata::policies
