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

/// A uint16 token file of `tokens` ids drawn from [0, vocab).
std::string writeTokenFile(const std::string &name, int64_t tokens, int64_t vocab, uint64_t seed) {
  llvm::SmallString<128> path;
  llvm::sys::fs::createUniquePath("tgc-data-%%%%%%-" + name, path, /*MakeAbsolute=*/true);
  std::ofstream out(path.c_str(), std::ios::binary);
  uint64_t state = seed;
  for (int64_t i = 0; i < tokens; ++i) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    uint16_t id = uint16_t((state >> 33) % uint64_t(vocab));
    out.put(char(id & 0xff)).put(char(id >> 8));
  }
  return path.str().str();
}

TEST(TokenFileData, WindowsAreTheFilesTokensInOrder) {
  std::string path = writeTokenFile("w.bin", 1000, 50, 1);
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
  std::string path = writeTokenFile("cut.bin", 4000, 50, 2);
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
  std::string a = writeTokenFile("a.bin", 3000, 50, 3), b = writeTokenFile("b.bin", 3000, 50, 3),
              c = writeTokenFile("c.bin", 3000, 50, 4);
  std::string da = unwrap(TokenFileData::open(a, 50, 16, 1))->digest();
  EXPECT_EQ(da.size(), 16u);
  EXPECT_EQ(unwrap(TokenFileData::open(b, 50, 16, 9))->digest(), da);
  EXPECT_NE(unwrap(TokenFileData::open(c, 50, 16, 1))->digest(), da);
  for (const std::string &p : {a, b, c})
    llvm::sys::fs::remove(p);
}

TEST(TokenFileData, ATokenOutsideTheVocabularyIsRefusedAtOpenWithItsIndex) {
  std::string path = writeTokenFile("v.bin", 500, 60, 5);
  auto data = TokenFileData::open(path, 40, 16, 1);
  ASSERT_FALSE(bool(data));
  std::string message = llvm::toString(data.takeError());
  EXPECT_NE(message.find("is outside the model's vocabulary of 40"), std::string::npos) << message;
  llvm::sys::fs::remove(path);
}

} // namespace
