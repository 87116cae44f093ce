// Each file of stages/ops/ adds its op types to the table op_types() builds once.
#pragma once

#include <vector>

#include "stages/op.h"

namespace baton::stages::ops {

void add_linear_ops(std::vector<OpType>& table);       // linear, matmul
void add_norm_ops(std::vector<OpType>& table);         // layernorm, softmax
void add_attention_ops(std::vector<OpType>& table);    // attention
void add_elementwise_ops(std::vector<OpType>& table);  // gelu, relu, add, dropout, reshape
void add_embedding_ops(std::vector<OpType>& table);    // embedding, position_embedding
void add_loss_ops(std::vector<OpType>& table);         // cross_entropy
void add_comm_ops(std::vector<OpType>& table);         // tensor-parallel communication
void add_bias_ops(std::vector<OpType>& table);         // bias_add (row-split linears)
void add_vision_ops(std::vector<OpType>& table);       // conv2d, batchnorm2d, pooling
void add_spatial_ops(std::vector<OpType>& table);      // spatial_mean
void add_llama_ops(std::vector<OpType>& table);        // rmsnorm, silu, swiglu, rotary
void add_fused_ops(std::vector<OpType>& table);        // add_layernorm, bias_gelu

}  // namespace baton::stages::ops
