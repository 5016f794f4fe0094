// --mlir-disable-threading is accepted (it turns the context's multithreading
// off) and changes no output.
// RUN: %topos-opt %s -p 'func.func(cse)' > %t.threads
// RUN: %topos-opt %s -p 'func.func(cse)' --mlir-disable-threading > %t.one
// RUN: %topos-opt %s -p 'func.func(cse)' -mlir-disable-threading | filecheck %s
// RUN: diff %t.threads %t.one

// CHECK-COUNT-1: stablehlo.multiply
// CHECK-NOT:     stablehlo.multiply

func.func @f(%a: tensor<2xf32>) -> (tensor<2xf32>, tensor<2xf32>) {
  %0 = stablehlo.multiply %a, %a : tensor<2xf32>
  %1 = stablehlo.multiply %a, %a : tensor<2xf32>
  return %0, %1 : tensor<2xf32>, tensor<2xf32>
}

func.func @g(%a: tensor<2xf32>) -> (tensor<2xf32>, tensor<2xf32>) {
  return %a, %a : tensor<2xf32>, tensor<2xf32>
}
