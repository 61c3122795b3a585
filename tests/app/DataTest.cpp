// Token files: windows read from the file (not mapped), a file cut short during the run an error
// at the next batch, and the digest a checkpoint keeps telling files of other bytes apart.
#include "app/Data.h"
#include "tests/TestUtil.h"

#include "llvm/Support/FileSystem.h"

#include <fstream>
#include <unistd.h>

using namespace tgc;
using namespace tgc::test;

namespace {

/// `tokens` ids drawn from [0, vocab), little-endian, `width` bytes each, after `header` (llm.c's).
std::string writeTokenFile(const std::string &name, int64_t tokens, int64_t vocab, uint64_t seed, int width = 2,
                           const std::vector<int32_t> &header = {}) {
  llvm::SmallString<128> path;
  llvm::sys::fs::createUniquePath("tgc-data-%%%%%%-" + name, path, /*MakeAbsolute=*/true);
  std::ofstream out(path.c_str(), std::ios::binary);
  for (int32_t word : header)
    for (int b = 0; b < 4; ++b)
      out.put(char((uint32_t(word) >> (8 * b)) & 0xff));
  uint64_t state = seed;
  for (int64_t i = 0; i < tokens; ++i) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    uint64_t id = (state >> 33) % uint64_t(vocab);
    for (int b = 0; b < width; ++b)
      out.put(char((id >> (8 * b)) & 0xff));
  }
  return path.str().str();
}

/// llm.c's header: 256 int32s, of which magic, version and the token count.
std::vector<int32_t> llmcHeader(int32_t magic, int32_t version, int32_t tokens) {
  std::vector<int32_t> header(256, 0);
  header[0] = magic, header[1] = version, header[2] = tokens;
  return header;
}

std::string openError(const std::string &path, int64_t vocab) {
  auto data = TokenFileData::open(path, vocab, 16, 1);
  return data ? "opened" : llvm::toString(data.takeError());
}

TEST(TokenFileData, WindowsAreTheFilesTokensInOrder) {
  std::string path = writeTokenFile("w.u16", 1000, 50, 1);
  auto data = unwrap(TokenFileData::open(path, 50, 16, 7));
  Batch b = unwrap(data->batch(3, 4));
  ASSERT_EQ(b.tokens.size(), 64u);
  std::ifstream in(path, std::ios::binary);
  std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(in)), {});
  // Each row is 16 consecutive tokens of the file, and its targets the same shifted by one.
  for (int64_t row = 0; row < 4; ++row) {
    bool found = false;
    for (size_t start = 0; start + 17 <= bytes.size() / 2 && !found; ++start) {
      found = true;
      for (int64_t i = 0; i < 16 && found; ++i) {
        auto at = [&](size_t j) { return int32_t(bytes[2 * j]) | int32_t(bytes[2 * j + 1]) << 8; };
        found = b.tokens[row * 16 + i] == at(start + i) && b.targets[row * 16 + i] == at(start + i + 1);
      }
    }
    EXPECT_TRUE(found) << "row " << row << " is no window of the file";
  }
  EXPECT_EQ(unwrap(data->batch(3, 4)).tokens, b.tokens);
  EXPECT_NE(unwrap(data->batch(4, 4)).tokens, b.tokens);
  llvm::sys::fs::remove(path);
}

TEST(TokenFileData, AFileCutShortDuringTheRunIsAnErrorAtTheNextBatch) {
  std::string path = writeTokenFile("cut.u16", 4000, 50, 2);
  auto data = unwrap(TokenFileData::open(path, 50, 32, 7));
  ASSERT_TRUE(bool(data->batch(0, 8)));
  ASSERT_EQ(::truncate(path.c_str(), 40), 0);
  // 8 windows of 33 tokens drawn over 4000: some start past byte 40.
  bool failed = false;
  for (int64_t i = 0; i < 4 && !failed; ++i) {
    auto batch = data->batch(i, 8);
    if (!batch) {
      std::string message = llvm::toString(batch.takeError());
      EXPECT_NE(message.find("the file is 40 bytes now, 8000 when the run began"), std::string::npos) << message;
      failed = true;
    }
  }
  EXPECT_TRUE(failed);
  llvm::sys::fs::remove(path);
}

TEST(TokenFileData, TheDigestFollowsTheBytesNotTheName) {
  std::string a = writeTokenFile("a.u16", 3000, 50, 3), b = writeTokenFile("b.u16", 3000, 50, 3),
              c = writeTokenFile("c.u16", 3000, 50, 4);
  std::string da = unwrap(TokenFileData::open(a, 50, 16, 1))->digest();
  EXPECT_EQ(da.size(), 16u);
  EXPECT_EQ(unwrap(TokenFileData::open(b, 50, 16, 9))->digest(), da);
  EXPECT_NE(unwrap(TokenFileData::open(c, 50, 16, 1))->digest(), da);
  for (const std::string &p : {a, b, c})
    llvm::sys::fs::remove(p);
}

TEST(TokenFileData, ATokenOutsideTheVocabularyIsRefusedAtOpenWithItsIndex) {
  std::string path = writeTokenFile("v.u16", 500, 60, 5);
  auto data = TokenFileData::open(path, 40, 16, 1);
  ASSERT_FALSE(bool(data));
  std::string message = llvm::toString(data.takeError());
  EXPECT_NE(message.find("is outside the model's vocabulary of 40"), std::string::npos) << message;
  llvm::sys::fs::remove(path);
}

TEST(TokenFileData, LlmcFilesAreReadByTheirHeaderInBothWidths) {
  // The same ids in a raw uint16 file, an llm.c GPT-2 file and an llm.c Llama 3 file (uint32):
  // the same windows, the header never among them.
  std::string raw = writeTokenFile("same.u16", 500, 60000, 6),
              gpt2 = writeTokenFile("g.bin", 500, 60000, 6, 2, llmcHeader(20240520, 1, 500)),
              llama = writeTokenFile("l.bin", 500, 60000, 6, 4, llmcHeader(20240801, 7, 500)),
              u32 = writeTokenFile("same.u32", 500, 60000, 6, 4);
  auto tokensOf = [](const std::string &path, int64_t vocab) {
    return unwrap(unwrap(TokenFileData::open(path, vocab, 16, 3))->batch(2, 4)).tokens;
  };
  std::vector<int32_t> expected = tokensOf(raw, 60000);
  EXPECT_EQ(tokensOf(gpt2, 60000), expected);
  EXPECT_EQ(tokensOf(llama, 60000), expected);
  EXPECT_EQ(tokensOf(u32, 60000), expected);
  EXPECT_NE(unwrap(TokenFileData::open(llama, 60000, 16, 3))->describe().find("(500 tokens, llm.c uint32 ids)"),
            std::string::npos);
  // Ids past 65535 in a uint32 file, checked against the vocabulary as any other.
  std::string big = writeTokenFile("big.u32", 300, 128256, 7, 4);
  EXPECT_EQ(openError(big, 128256), "opened");
  EXPECT_NE(openError(big, 65536).find("is outside the model's vocabulary of 65536"), std::string::npos);
  for (const std::string &p : {raw, gpt2, llama, u32, big})
    llvm::sys::fs::remove(p);
}

TEST(TokenFileData, ABadLlmcHeaderIsOneErrorNamingWhatIsWrong) {
  std::string magic = writeTokenFile("m.bin", 100, 50, 1, 2, llmcHeader(20240521, 1, 100)),
              version = writeTokenFile("v.bin", 100, 50, 1, 2, llmcHeader(20240520, 7, 100)),
              shortFile = writeTokenFile("s.bin", 90, 50, 1, 2, llmcHeader(20240520, 1, 100)),
              tiny = writeTokenFile("t.bin", 10, 50, 1);
  EXPECT_NE(openError(magic, 50).find("error: not an llm.c token file: magic 20240521 version 1"), std::string::npos)
      << openError(magic, 50);
  EXPECT_NE(openError(version, 50).find("not an llm.c token file: magic 20240520 version 7"), std::string::npos);
  EXPECT_NE(openError(shortFile, 50).find("its llm.c header says 100 tokens of 2 bytes, and the file holds 180 bytes "
                                          "after the header (cut short?)"),
            std::string::npos)
      << openError(shortFile, 50);
  EXPECT_NE(openError(tiny, 50).find("20 bytes, shorter than llm.c's 1024-byte header"), std::string::npos);
  for (const std::string &p : {magic, version, shortFile, tiny})
    llvm::sys::fs::remove(p);
}

} // namespace
