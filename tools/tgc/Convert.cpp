// tgc convert: a Hugging Face model folder (transformers' save_pretrained) to a tgc checkpoint
// and its model file, or a tgc checkpoint to a Hugging Face folder.
#include "app/HuggingFace.h"
#include "support/Files.h"
#include "tools/tgc/Options.h"

#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"

#include <fmt/format.h>

namespace tgc::cli {

namespace {

static cl::opt<std::string> ConvertFrom(cl::Positional, cl::desc("<hf-folder | checkpoint.safetensors>"), cl::Required,
                                        cl::sub(convertCommand()), cl::cat(category()));
static cl::opt<std::string> ConvertTo("o",
                                      cl::desc("From a folder: the tgc checkpoint to write; from a checkpoint: the "
                                               "Hugging Face folder to write"),
                                      cl::value_desc("path"), cl::Required, cl::sub(convertCommand()),
                                      cl::cat(category()));
static cl::opt<std::string> ConvertModelFile("model-file",
                                             cl::desc("Also write the model's description here (for tgc train "
                                                      "MODEL.yaml --init CHECKPOINT); default: beside the checkpoint, "
                                                      "its name with .yaml"),
                                             cl::value_desc("model.yaml"), cl::sub(convertCommand()),
                                             cl::cat(category()));
static cl::opt<int64_t> ConvertSeqLen("seq-len",
                                      cl::desc("The model's window (default: config.json's max_position_embeddings "
                                               "or n_positions)"),
                                      cl::init(0), cl::sub(convertCommand()), cl::cat(category()));

int importFolder() {
  std::string modelFile = ConvertModelFile.empty() ? llvm::sys::path::stem(ConvertTo).str() + ".yaml"
                                                   : ConvertModelFile.getValue();
  if (ConvertModelFile.empty()) { // beside the checkpoint
    llvm::SmallString<256> path(llvm::sys::path::parent_path(ConvertTo));
    llvm::sys::path::append(path, modelFile);
    modelFile = path.str().str();
  }
  if (auto err = checkDistinctFiles({{"the folder", ConvertFrom}, {"-o", ConvertTo}, {"--model-file", modelFile}}))
    return report(std::move(err));
  if (auto target = replaceableTarget(ConvertTo); !target) // refused before the weights are read
    return report(target.takeError());
  HfNotes notes;
  std::string name = llvm::sys::path::filename(llvm::sys::path::remove_leading_dotslash(ConvertFrom)).str();
  auto model = importHf(ConvertFrom, ConvertTo, name.empty() ? "model" : name, ConvertSeqLen, notes);
  if (!model)
    return report(model.takeError());
  if (auto err = writeFileAtomically(modelFile, formatModelConfig(*model)))
    return report(std::move(err));
  llvm::outs() << fmt::format("wrote {} ({} parameters: {} layers, d_model {}, {} heads{}, vocab {}, window {}) and "
                              "its model file {}\n",
                              ConvertTo.getValue(), model->numParams(), model->layers, model->dModel, model->heads,
                              model->kvHeadCount() != model->heads ? fmt::format(" ({} KV)", model->kvHeadCount()) : "",
                              model->vocab, model->seqLen, modelFile);
  for (const std::string &line : notes.lines)
    llvm::outs() << "note: " << line << "\n";
  return 0;
}

int exportCheckpoint() {
  auto trained = loadTrained(ConvertFrom, /*requireFinite=*/true);
  if (!trained)
    return report(trained.takeError());
  auto &[config, checkpoint] = *trained;
  if (auto err = exportHf(config, checkpoint, ConvertTo))
    return report(std::move(err));
  llvm::outs() << fmt::format("wrote {}/config.json and model.safetensors ({} parameters, {})\n", ConvertTo.getValue(),
                              config.numParams(), config.position == PositionKind::Learned ? "GPT2LMHeadModel"
                                                                                            : "LlamaForCausalLM");
  return 0;
}

} // namespace

int runConvert() {
  if (auto err = checkNotEmpty({&ConvertTo, &ConvertModelFile}))
    return report(std::move(err));
  if (ConvertSeqLen < 0)
    return report(flagError(fmt::format("--seq-len takes a length > 0, got {}", int64_t(ConvertSeqLen))));
  return llvm::sys::fs::is_directory(ConvertFrom) ? importFolder() : exportCheckpoint();
}

} // namespace tgc::cli
