#include <protean/protean.h>
#include <iostream>
int main() {
  namespace pt = protean;
  pt::Tensor x = pt::arange(0, 5, 1, pt::DType::F32);
  std::cout << "sum=" << pt::sum(x).item<float>() << "\n";
  return 0;
}
