fn main() -> std::process::ExitCode {
    taskledger::cli::main()
}
