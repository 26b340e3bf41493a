// How SentencePiece vocabularies (and the tokenizer.json files converted from
// them) spell whitespace and raw bytes as pieces. Private to
// policies/tokenizer.
#ifndef STRATA_POLICIES_TOKENIZER_PIECE_SYNTAX_H_
#define STRATA_POLICIES_TOKENIZER_PIECE_SYNTAX_H_

#include <string_view>

namespace strata::policies::internal {

// U+2581 LOWER ONE EIGHTH BLOCK, the visible whitespace of the pieces.
inline constexpr std::string_view kSpaceSymbol = "\xE2\x96\x81";

// "<0x41>" -> 0x41 (hex digits in either case); -1 when `piece` is not a
// byte piece.
int BytePieceValue(std::string_view piece);

}  // namespace strata::policies::internal

#endif  // STRATA_POLICIES_TOKENIZER_PIECE_SYNTAX_H_
