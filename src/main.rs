fn main() {
    std::process::exit(artune::cli::main());
}
