// A one-op dialect for topos-opt's --irdl-file test.
irdl.dialect @toy {
  irdl.operation @twice {
    %t = irdl.any
    irdl.operands(x: %t)
    irdl.results(r: %t)
  }
}
