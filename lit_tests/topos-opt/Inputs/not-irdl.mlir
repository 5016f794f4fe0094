// Not IRDL: iree-opt refuses it, at this file's line.
irdl.dialect @broken {
  irdl.operation @x {
    %t = irdl.frobnicate
  }
}
