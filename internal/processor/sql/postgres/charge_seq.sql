SELECT seq FROM processor_charges WHERE id = $1;
