// RingletAllreduce: the graph operation behind ringlet.hvd.tensorflow's allreduce, compiled
// on first use by _kernel.py against the TensorFlow that imports it.
//
// It hands Python (the dispatcher _kernel.py installs) the memory of its inputs and outputs,
// and Python runs ringlet's allreduce on it. The reduction is in place when TensorFlow lets
// go of every input; otherwise it reads the inputs where they are and writes results this
// operation keeps from call to call, so that a step neither copies its gradients nor
// page-faults fresh memory for them. tf.numpy_function, which it replaces, copies nothing
// either but converts every tensor (docs/guide/tensorflow.md has what that costs).

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace {

using tensorflow::AllocatorAttributes;
using tensorflow::DEVICE_CPU;
using tensorflow::DEVICE_MEMORY;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;

// Python's side: reduce `count` tensors, in place where inputs[i] == outputs[i]. `dims`
// holds every tensor's dimensions one after another, `ranks` how many each has. Returns 0,
// or a TensorFlow error code with its message written into `message` (NUL-terminated).
extern "C" typedef int32_t (*Dispatcher)(int64_t callback, int32_t count,
                                         void* const* inputs, void* const* outputs,
                                         const int64_t* dims, const int32_t* ranks,
                                         char* message, int32_t message_size);

std::atomic<Dispatcher> dispatcher{nullptr};

char* data_of(const Tensor& tensor) {
  return const_cast<char*>(tensor.tensor_data().data());
}

// Transparent huge pages for a large result, as NumPy asks for its arrays of 4 MiB and more:
// a reduction streams through its buffers, and with 4 KiB pages it runs 10-20% slower here.
// Only advice: where the kernel does not take it, nothing changes.
void AskForHugePages(const Tensor& tensor) {
  constexpr uintptr_t kLarge = 4 << 20;
  const auto data = tensor.tensor_data();
  if (data.size() < kLarge) return;
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t start = (reinterpret_cast<uintptr_t>(data.data()) + page - 1) & ~(page - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(data.data()) + data.size()) & ~(page - 1);
  if (end > start) madvise(reinterpret_cast<void*>(start), end - start, MADV_HUGEPAGE);
}

class RingletAllreduceOp : public OpKernel {
 public:
  explicit RingletAllreduceOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("callback", &callback_));
  }

  void Compute(OpKernelContext* context) override {
    const Dispatcher call = dispatcher.load();
    OP_REQUIRES(context, call != nullptr,
                absl::FailedPreconditionError(
                    "ringlet's TensorFlow dispatcher is not installed (load this library "
                    "through ringlet.hvd.tensorflow)"));
    const int count = context->num_inputs();
    std::vector<void*> inputs(count), outputs(count);
    std::vector<int64_t> dims;
    std::vector<int32_t> ranks(count);
    for (int i = 0; i < count; ++i) {
      const Tensor& input = context->input(i);
      inputs[i] = data_of(input);
      ranks[i] = input.dims();
      for (int d = 0; d < input.dims(); ++d) dims.push_back(input.dim_size(d));
    }

    // In place only when every input can be: a mixed call would have to tell Python which.
    std::vector<std::unique_ptr<Tensor>> forwarded(count);
    bool in_place = true;
    for (int i = 0; i < count && in_place; ++i) {
      const Tensor& input = context->input(i);
      forwarded[i] = context->forward_input(i, i, input.dtype(), input.shape(), DEVICE_MEMORY,
                                            AllocatorAttributes());
      in_place = forwarded[i] != nullptr;
    }
    if (in_place) {
      for (int i = 0; i < count; ++i) {
        context->set_output(i, *forwarded[i]);
        outputs[i] = inputs[i];
      }
    } else {
      forwarded.clear();
      std::lock_guard<std::mutex> lock(mutex_);
      kept_.resize(count);
      for (int i = 0; i < count; ++i) {
        Tensor* result = nullptr;
        OP_REQUIRES_OK(context, KeptResult(context, i, &result));
        context->set_output(i, *result);  // TensorFlow's reference: not free until released
        outputs[i] = data_of(*result);
      }
    }

    std::array<char, 2048> message{};
    const int32_t code = call(callback_, count, inputs.data(), outputs.data(), dims.data(),
                              ranks.data(), message.data(), message.size());
    if (code != 0) {
      message.back() = '\0';
      context->SetStatus(absl::Status(static_cast<absl::StatusCode>(code), message.data()));
    }
  }

 private:
  // Output i's buffer: one of those kept for it that TensorFlow no longer holds, else a new
  // one in place of the oldest. Three: the last step's result may still be held, and
  // TensorFlow lets go of the one before only after the next call has started.
  absl::Status KeptResult(OpKernelContext* context, int i, Tensor** result) {
    const Tensor& input = context->input(i);
    Kept& kept = kept_[i];
    for (Tensor& buffer : kept.buffers) {
      if (buffer.IsInitialized() && buffer.RefCountIsOne() &&
          buffer.dtype() == input.dtype() && buffer.shape() == input.shape()) {
        *result = &buffer;
        return absl::OkStatus();
      }
    }
    Tensor& oldest = kept.buffers[kept.next];
    kept.next = (kept.next + 1) % kept.buffers.size();
    TF_RETURN_IF_ERROR(context->allocate_temp(input.dtype(), input.shape(), &oldest));
    AskForHugePages(oldest);
    *result = &oldest;
    return absl::OkStatus();
  }

  struct Kept {
    std::array<Tensor, 3> buffers;
    size_t next = 0;  // the one a new buffer replaces
  };

  int64_t callback_ = 0;
  std::mutex mutex_;  // the same node may run on two threads at once
  std::vector<Kept> kept_;
};

}  // namespace

extern "C" void ringlet_set_dispatcher(Dispatcher function) { dispatcher.store(function); }

REGISTER_OP("RingletAllreduce")
    .Input("inputs: T")
    .Output("outputs: T")
    .Attr("T: list({half, bfloat16, float, double, int8, int16, int32, int64, uint8, uint16, "
          "uint32, uint64, bool})")
    .Attr("callback: int")
    .SetIsStateful()
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* context) {
      for (int i = 0; i < context->num_inputs(); ++i) context->set_output(i, context->input(i));
      return absl::OkStatus();
    });

REGISTER_KERNEL_BUILDER(Name("RingletAllreduce").Device(DEVICE_CPU), RingletAllreduceOp);
