fn main() {
    artune::fabric::cuda::prefetch::exit(artune::cli::main());
}
