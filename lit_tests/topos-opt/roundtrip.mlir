// Printing and reparsing topos IR changes nothing, in the default and the generic form.
// RUN: %topos-opt %s | filecheck %s
// RUN: %topos-opt %s | %topos-opt | filecheck %s
// RUN: %topos-opt %s --mlir-print-op-generic > %t.generic
// RUN: %topos-opt %t.generic --mlir-print-op-generic > %t.again
// RUN: diff %t.generic %t.again
// RUN: %topos-opt %s --mlir-print-debuginfo | %topos-opt --mlir-print-debuginfo | filecheck %s --check-prefix=LOC

// CHECK-LABEL: module @topos {
// CHECK:       func.func @main(%arg0: tensor<2x2xf32>, %arg1: tensor<1x2xf32>) -> tensor<f32> {
// CHECK-NEXT:    %0 = "topos.parameter"(%arg0) {node = 0 : i64} : (tensor<2x2xf32>) -> tensor<2x2xf32>
// CHECK-NEXT:    %1 = "topos.input"(%arg1) {node = 1 : i64} : (tensor<1x2xf32>) -> tensor<1x2xf32>
// CHECK-NEXT:    %2 = "topos.matmul"(%1, %0) {node = 2 : i64} : (tensor<1x2xf32>, tensor<2x2xf32>) -> tensor<1x2xf32>
// CHECK-NEXT:    %3 = "topos.map"(%2) {function = "tanh", node = 3 : i64} : (tensor<1x2xf32>) -> tensor<1x2xf32>
// CHECK-NEXT:    %4 = "topos.leaf"() {node = 4 : i64, value = dense<2.000000e+00> : tensor<1x2xf32>} : () -> tensor<1x2xf32>
// CHECK-NEXT:    %5 = "topos.pow"(%3, %4) {node = 5 : i64} : (tensor<1x2xf32>, tensor<1x2xf32>) -> tensor<1x2xf32>
// CHECK-NEXT:    %6 = "topos.sum"(%5) {node = 6 : i64} : (tensor<1x2xf32>) -> tensor<f32>
// CHECK-NEXT:    return %6 : tensor<f32>

// Locations (node name around the recording line) survive a round trip.
// LOC: "topos.map"(%2) {function = "tanh", node = 3 : i64} : (tensor<1x2xf32>) -> tensor<1x2xf32> loc([[MAP:#loc[0-9]+]])
// LOC: [[FILE:#loc[0-9]+]] = loc("model.py":8:0)
// LOC: [[MAP]] = loc("%3 map"([[FILE]]))

module @topos {
  func.func @main(%arg0: tensor<2x2xf32>, %arg1: tensor<1x2xf32>) -> tensor<f32> {
    %0 = "topos.parameter"(%arg0) {node = 0 : i64} : (tensor<2x2xf32>) -> tensor<2x2xf32> loc(#loc4)
    %1 = "topos.input"(%arg1) {node = 1 : i64} : (tensor<1x2xf32>) -> tensor<1x2xf32> loc(#loc5)
    %2 = "topos.matmul"(%1, %0) {node = 2 : i64} : (tensor<1x2xf32>, tensor<2x2xf32>) -> tensor<1x2xf32> loc(#loc6)
    %3 = "topos.map"(%2) {function = "tanh", node = 3 : i64} : (tensor<1x2xf32>) -> tensor<1x2xf32> loc(#loc7)
    %4 = "topos.leaf"() {node = 4 : i64, value = dense<2.000000e+00> : tensor<1x2xf32>} : () -> tensor<1x2xf32> loc(#loc8)
    %5 = "topos.pow"(%3, %4) {node = 5 : i64} : (tensor<1x2xf32>, tensor<1x2xf32>) -> tensor<1x2xf32> loc(#loc9)
    %6 = "topos.sum"(%5) {node = 6 : i64} : (tensor<1x2xf32>) -> tensor<f32> loc(#loc10)
    return %6 : tensor<f32>
  }
}
#loc1 = loc("model.py":6:0)
#loc2 = loc("model.py":7:0)
#loc3 = loc("model.py":8:0)
#loc4 = loc("%0 parameter"(#loc1))
#loc5 = loc("%1 input"(#loc2))
#loc6 = loc("%2 matmul"(#loc3))
#loc7 = loc("%3 map"(#loc3))
#loc8 = loc("%4 leaf"(#loc3))
#loc9 = loc("%5 pow"(#loc3))
#loc10 = loc("%6 sum"(#loc3))
